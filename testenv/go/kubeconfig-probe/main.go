// dwd-lease-kubeconfig-probe: what client-go makes of a kubeconfig, for the differential test of
// our two readers (tests/integration/test_kubeconfig_clientgo.py).
//
// stdin: a JSON array of {"mode", "path"}. mode "file" loads the file as the kubelet loads its
// kubeconfig (cmd/kubelet/app/server.go: a deferred loading client config with the file as its
// explicit path, no overrides; relative paths resolved against the file's directory); mode
// "bytes" loads the file's content as a kubeconfig taken from a Secret is loaded
// (clientcmd.RESTConfigFromKubeConfig). stdout: a JSON array, one object per entry: the
// rest.Config fields that say where and how to connect, or {"error": "..."}.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

type entry struct {
	Mode string `json:"mode"`
	Path string `json:"path"`
}

type result struct {
	Error           string `json:"error,omitempty"`
	Host            string `json:"host"`
	CAData          string `json:"caData"`
	CAFile          string `json:"caFile"`
	ServerName      string `json:"serverName"`
	Insecure        bool   `json:"insecure"`
	BearerToken     string `json:"bearerToken"`
	BearerTokenFile string `json:"bearerTokenFile"`
	CertData        string `json:"certData"`
	KeyData         string `json:"keyData"`
	CertFile        string `json:"certFile"`
	KeyFile         string `json:"keyFile"`
	Username        string `json:"username"`
	Password        string `json:"password"`
	Exec            bool   `json:"exec"`
	AuthProvider    bool   `json:"authProvider"`
	Proxy           bool   `json:"proxy"`
}

func main() {
	var entries []entry
	if err := json.NewDecoder(os.Stdin).Decode(&entries); err != nil {
		fmt.Fprintf(os.Stderr, "stdin: not a JSON array of {mode, path}: %v\n", err)
		os.Exit(2)
	}
	out := make([]result, len(entries))
	for i, e := range entries {
		config, err := load(e)
		if err != nil {
			out[i] = result{Error: err.Error()}
			continue
		}
		out[i] = describe(config)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "stdout: %v\n", err)
		os.Exit(1)
	}
}

func load(e entry) (*rest.Config, error) {
	switch e.Mode {
	case "file":
		return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: e.Path},
			&clientcmd.ConfigOverrides{},
		).ClientConfig()
	case "bytes":
		data, err := os.ReadFile(e.Path)
		if err != nil {
			return nil, err
		}
		return clientcmd.RESTConfigFromKubeConfig(data)
	}
	return nil, fmt.Errorf("mode %q: neither file nor bytes", e.Mode)
}

func describe(c *rest.Config) result {
	return result{
		Host:            c.Host,
		CAData:          string(c.TLSClientConfig.CAData),
		CAFile:          c.TLSClientConfig.CAFile,
		ServerName:      c.TLSClientConfig.ServerName,
		Insecure:        c.TLSClientConfig.Insecure,
		BearerToken:     c.BearerToken,
		BearerTokenFile: c.BearerTokenFile,
		CertData:        string(c.TLSClientConfig.CertData),
		KeyData:         string(c.TLSClientConfig.KeyData),
		CertFile:        c.TLSClientConfig.CertFile,
		KeyFile:         c.TLSClientConfig.KeyFile,
		Username:        c.Username,
		Password:        c.Password,
		Exec:            c.ExecProvider != nil,
		AuthProvider:    c.AuthProvider != nil,
		Proxy:           c.Proxy != nil,
	}
}
