// dwd-lease-gardener-types: checks test fixtures against Gardener's own Go types.
//
// Ours, not Gardener's: testenv/grm.py copies it into a copy of Gardener's module tree and
// builds it in the same `go build` as gardener-resource-manager, so it decodes with the very
// types (and the very release) the seed's components decode with.
//
// stdin: a JSON array of objects. stdout: a JSON array of error strings, one per object, ""
// for one that decodes. "Strictly": sigs.k8s.io/json's UnmarshalStrict, case-sensitive, an
// unknown or a duplicate field is an error naming its path. A schemaless CRD stores whatever
// it is given and Go's decoder drops what it does not know, so without this a misspelt field
// (status.isHibernated for status.hibernated) reads as its zero value, silently.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	gardencorev1beta1 "github.com/gardener/gardener/pkg/apis/core/v1beta1"
	extensionsv1alpha1 "github.com/gardener/gardener/pkg/apis/extensions/v1alpha1"
	resourcesv1alpha1 "github.com/gardener/gardener/pkg/apis/resources/v1alpha1"
	"github.com/gardener/gardener/pkg/extensions"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "sigs.k8s.io/json"
)

const coreAPIVersion = "core.gardener.cloud/v1beta1"

type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

func main() {
	var objects []json.RawMessage
	if err := json.NewDecoder(os.Stdin).Decode(&objects); err != nil {
		fmt.Fprintf(os.Stderr, "stdin: not a JSON array of objects: %v\n", err)
		os.Exit(2)
	}
	out := make([]string, len(objects))
	for i, raw := range objects {
		if err := check(raw); err != nil {
			out[i] = err.Error()
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "stdout: %v\n", err)
		os.Exit(1)
	}
}

func check(raw []byte) error {
	var meta typeMeta
	if err := json.Unmarshal(raw, &meta); err != nil {
		return err
	}
	switch meta.Kind {
	case "Cluster":
		return checkCluster(raw)
	case "Shoot":
		return checkTyped(raw, coreAPIVersion, "Shoot", &gardencorev1beta1.Shoot{})
	case "Seed":
		return checkTyped(raw, coreAPIVersion, "Seed", &gardencorev1beta1.Seed{})
	case "CloudProfile":
		return checkTyped(raw, coreAPIVersion, "CloudProfile", &gardencorev1beta1.CloudProfile{})
	case "Extension":
		return checkTyped(raw, extensionsv1alpha1.SchemeGroupVersion.String(), "Extension", &extensionsv1alpha1.Extension{})
	case "ManagedResource":
		return checkTyped(raw, resourcesv1alpha1.SchemeGroupVersion.String(), "ManagedResource", &resourcesv1alpha1.ManagedResource{})
	}
	return fmt.Errorf("kind %q (apiVersion %q): not a kind this checker knows", meta.Kind, meta.APIVersion)
}

// checkTyped: the object's type meta is the one Gardener's scheme registers for into, and
// every field of it is one of into's.
func checkTyped(raw []byte, apiVersion, kind string, into any) error {
	var meta typeMeta
	if err := json.Unmarshal(raw, &meta); err != nil {
		return err
	}
	if meta.APIVersion != apiVersion || meta.Kind != kind {
		return fmt.Errorf("apiVersion/kind %q/%q, want %q/%q", meta.APIVersion, meta.Kind, apiVersion, kind)
	}
	return strict(raw, into)
}

func strict(raw []byte, into any) error {
	strictErrs, err := kjson.UnmarshalStrict(raw, into)
	if err != nil {
		return err
	}
	msgs := make([]string, len(strictErrs))
	for i, e := range strictErrs {
		msgs[i] = e.Error()
	}
	return joined(msgs)
}

// checkCluster decodes the Cluster, each object it embeds strictly, and then each the way
// gardener's extensions library does (ShootFromCluster and its siblings, dependency-watchdog's
// path): through the GardenCodec's universal deserializer.
func checkCluster(raw []byte) error {
	cluster := &extensionsv1alpha1.Cluster{}
	if err := checkTyped(raw, extensionsv1alpha1.SchemeGroupVersion.String(), "Cluster", cluster); err != nil {
		return err
	}
	embedded := []struct {
		field, kind string
		raw         runtime.RawExtension
		into        any
	}{
		{"spec.shoot", "Shoot", cluster.Spec.Shoot, &gardencorev1beta1.Shoot{}},
		{"spec.seed", "Seed", cluster.Spec.Seed, &gardencorev1beta1.Seed{}},
		{"spec.cloudProfile", "CloudProfile", cluster.Spec.CloudProfile, &gardencorev1beta1.CloudProfile{}},
	}
	var errs []string
	for _, e := range embedded {
		if len(e.raw.Raw) == 0 || string(e.raw.Raw) == "null" {
			// The extensions library returns nil for it, and dependency-watchdog dereferences that.
			errs = append(errs, e.field+": missing")
			continue
		}
		if err := checkTyped(e.raw.Raw, coreAPIVersion, e.kind, e.into); err != nil {
			errs = append(errs, e.field+": "+err.Error())
		}
	}
	if err := viaExtensions(cluster); err != nil {
		errs = append(errs, err.Error())
	}
	return joined(errs)
}

func viaExtensions(cluster *extensionsv1alpha1.Cluster) error {
	if _, err := extensions.ShootFromCluster(cluster); err != nil {
		return fmt.Errorf("ShootFromCluster: %w", err)
	}
	if _, err := extensions.SeedFromCluster(cluster); err != nil {
		return fmt.Errorf("SeedFromCluster: %w", err)
	}
	if _, err := extensions.CloudProfileFromCluster(cluster); err != nil {
		return fmt.Errorf("CloudProfileFromCluster: %w", err)
	}
	return nil
}

func joined(errs []string) error {
	if len(errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(errs, "; "))
}
