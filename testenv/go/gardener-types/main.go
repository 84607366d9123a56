// dwd-lease-gardener-types: test fixtures checked against Gardener's own Go code.
//
// Ours, not Gardener's: testenv/grm.py copies it into a copy of Gardener's module tree and
// builds it in the same `go build` as gardener-resource-manager, so it decodes, judges and
// renders with the very code (and the very release) the seed's components run.
//
// Eight verbs (argv[1]; none: check), each reading JSON on stdin and writing JSON on stdout:
//
//	check            an array of objects -> an array of error strings, one per object, "" for
//	                 one that decodes. "Strictly": sigs.k8s.io/json's UnmarshalStrict,
//	                 case-sensitive, an unknown or a duplicate field is an error naming its path.
//	                 A schemaless CRD stores whatever it is given and Go's decoder drops what it
//	                 does not know, so without this a misspelt field (status.isHibernated for
//	                 status.hibernated) reads as its zero value, silently. Gardener's kinds by
//	                 their own rules (below); any other kind the seed's scheme knows (apps,
//	                 RBAC, policy, VPA, ...) into its Go type.
//	check-extension  an array of Extension objects -> an array of gardenlet's verdicts, "" for
//	                 ready, else the error text of health.CheckExtensionObject, and where it
//	                 carries error codes, " [codes ...; retryable|non-retryable]" as gardenlet
//	                 classifies them (v1beta1helper.HasNonRetryableErrorCode: the owner's to fix).
//	render-chart     a renderRequest -> a renderResponse: a ControllerDeployment's chart archive
//	                 rendered by pkg/chartrenderer as gardenlet's ControllerInstallation
//	                 reconciler renders it, with the seed's name injected as it injects it.
//	find-images      an array of imageRequests -> an array of imageAnswers: an image as
//	                 Gardener's image vector resolves it under an overwrite.
//	force-deletion   an array of Clusters -> an array of "true" or "false": whether the Shoot
//	                 each embeds is confirmed for force deletion, by the extensions library's
//	                 ShootFromCluster and v1beta1helper.ShootNeedsForceDeletion.
//	shoot-condition  an array of conditionRequests -> an array of conditionAnswers: what
//	                 gardenlet's shoot care makes of an Extension's SystemComponentsHealthy
//	                 (checker.CheckExtensionCondition, given its controller's heartbeat Lease):
//	                 the Shoot's condition it forces, or status "" where it lets the others decide.
//	pull-chart       a reference -> a pullAnswer: the chart archive gardener-operator's puller
//	                 (pkg/utils/oci HelmRegistry.Pull) takes from an OCI artifact at it.
//	registry         (no JSON) a registry on loopback, go-containerregistry's own, serving until
//	                 stdin closes; its address the one line on stdout. Ours to push to.
//
// An operator.gardener.cloud Extension is checked as gardener-operator's validating webhook
// checks it (pkg/api/operator/v1alpha1/validation.ValidateExtension) after the strict decode,
// without its defaulting webhook before: a manifest must say what that would default.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/registry"

	v1beta1helper "github.com/gardener/gardener/pkg/api/core/v1beta1/helper"
	operatorvalidation "github.com/gardener/gardener/pkg/api/operator/v1alpha1/validation"
	gardencorev1 "github.com/gardener/gardener/pkg/apis/core/v1"
	gardencorev1beta1 "github.com/gardener/gardener/pkg/apis/core/v1beta1"
	v1beta1constants "github.com/gardener/gardener/pkg/apis/core/v1beta1/constants"
	extensionsv1alpha1 "github.com/gardener/gardener/pkg/apis/extensions/v1alpha1"
	operatorv1alpha1 "github.com/gardener/gardener/pkg/apis/operator/v1alpha1"
	resourcesv1alpha1 "github.com/gardener/gardener/pkg/apis/resources/v1alpha1"
	"github.com/gardener/gardener/pkg/chartrenderer"
	"github.com/gardener/gardener/pkg/client/kubernetes"
	"github.com/gardener/gardener/pkg/extensions"
	"github.com/gardener/gardener/pkg/features"
	gardenletfeatures "github.com/gardener/gardener/pkg/gardenlet/features"
	"github.com/gardener/gardener/pkg/utils"
	gardenerutils "github.com/gardener/gardener/pkg/utils/gardener"
	"github.com/gardener/gardener/pkg/utils/imagevector"
	kubernetesutils "github.com/gardener/gardener/pkg/utils/kubernetes"
	"github.com/gardener/gardener/pkg/utils/kubernetes/health"
	healthchecker "github.com/gardener/gardener/pkg/utils/kubernetes/health/checker"
	"github.com/gardener/gardener/pkg/utils/oci"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	apimachineryversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/component-base/featuregate"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	kjson "sigs.k8s.io/json"
)

const coreAPIVersion = "core.gardener.cloud/v1beta1"

type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

func main() {
	verb := "check"
	if len(os.Args) > 1 {
		verb = os.Args[1]
	}
	verbs := map[string]func(io.Reader) (any, error){
		"check":           checkAll,
		"check-extension": checkExtensions,
		"render-chart":    renderChart,
		"find-images":     findImages,
		"force-deletion":  forceDeletion,
		"shoot-condition": shootCondition,
		"pull-chart":      pullChart,
	}
	if verb == "registry" {
		if err := serveRegistry(); err != nil {
			fmt.Fprintf(os.Stderr, "registry: %v\n", err)
			os.Exit(1)
		}
		return
	}
	run, ok := verbs[verb]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown verb %q: want check, check-extension, render-chart, find-images, force-deletion, shoot-condition, pull-chart or registry\n", verb)
		os.Exit(2)
	}
	out, err := run(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", verb, err)
		os.Exit(2)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "stdout: %v\n", err)
		os.Exit(1)
	}
}

func readArray(in io.Reader) ([]json.RawMessage, error) {
	var objects []json.RawMessage
	if err := json.NewDecoder(in).Decode(&objects); err != nil {
		return nil, fmt.Errorf("stdin: not a JSON array of objects: %w", err)
	}
	return objects, nil
}

func checkAll(in io.Reader) (any, error) {
	objects, err := readArray(in)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(objects))
	for i, raw := range objects {
		if err := check(raw); err != nil {
			out[i] = err.Error()
		}
	}
	return out, nil
}

// checkExtensions: gardenlet's verdict on each Extension (an object that does not decode
// strictly as one is an error of the whole run, naming its index: a verdict on a misread
// object would prove nothing).
func checkExtensions(in io.Reader) (any, error) {
	return eachOf(in, "Extension", func(ext *extensionsv1alpha1.Extension) (string, error) {
		err := health.CheckExtensionObject(ext)
		if err == nil {
			return "", nil
		}
		codes := v1beta1helper.ExtractErrorCodes(err)
		if len(codes) == 0 {
			return err.Error(), nil
		}
		kind := "retryable"
		if v1beta1helper.HasNonRetryableErrorCode(gardencorev1beta1.LastError{Codes: codes}) {
			kind = "non-retryable"
		}
		return fmt.Sprintf("%s [codes %v; %s]", err.Error(), codes, kind), nil
	})
}

// eachOf: each object of a JSON array decoded strictly as an extensions.gardener.cloud/v1alpha1
// kind into a new T and answered by answer; an object that does not decode, or that answer
// cannot judge, is an error of the whole run naming its index.
func eachOf[T any](in io.Reader, kind string, answer func(*T) (string, error)) ([]string, error) {
	objects, err := readArray(in)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(objects))
	for i, raw := range objects {
		obj := new(T)
		if err := checkTyped(raw, extensionsv1alpha1.SchemeGroupVersion.String(), kind, obj); err != nil {
			return nil, fmt.Errorf("object %d: %w", i, err)
		}
		if out[i], err = answer(obj); err != nil {
			return nil, fmt.Errorf("object %d: %w", i, err)
		}
	}
	return out, nil
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
	case "ManagedResource":
		return checkTyped(raw, resourcesv1alpha1.SchemeGroupVersion.String(), "ManagedResource", &resourcesv1alpha1.ManagedResource{})
	case "Extension":
		if meta.APIVersion == operatorv1alpha1.SchemeGroupVersion.String() {
			return checkOperatorExtension(raw)
		}
		return checkTyped(raw, extensionsv1alpha1.SchemeGroupVersion.String(), "Extension", &extensionsv1alpha1.Extension{})
	case "ControllerRegistration":
		return checkTyped(raw, coreAPIVersion, "ControllerRegistration", &gardencorev1beta1.ControllerRegistration{})
	case "ControllerDeployment":
		return checkControllerDeployment(raw, meta.APIVersion)
	}
	return checkSeedKind(raw, meta)
}

// checkOperatorExtension: decoded strictly, then judged by the operator's own validation.
func checkOperatorExtension(raw []byte) error {
	ext := &operatorv1alpha1.Extension{}
	if err := strict(raw, ext); err != nil {
		return err
	}
	return operatorvalidation.ValidateExtension(ext).ToAggregate()
}

// serveRegistry: go-containerregistry's registry on 127.0.0.1 (spoken to in plain HTTP, by a
// pusher and Gardener's puller alike), its address on stdout, until stdin closes.
func serveRegistry() error {
	server := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer server.Close()
	fmt.Println(strings.TrimPrefix(server.URL, "http://"))
	_, err := io.Copy(io.Discard, os.Stdin)
	return err
}

type pullAnswer struct {
	Chart []byte `json:"chart"`
}

func pullChart(in io.Reader) (any, error) {
	var ref string
	if err := json.NewDecoder(in).Decode(&ref); err != nil {
		return nil, fmt.Errorf("stdin: not a reference as a JSON string: %w", err)
	}
	chart, err := oci.NewHelmRegistry(nil).Pull(context.Background(), &gardencorev1.OCIRepository{Ref: &ref})
	if err != nil {
		return nil, err
	}
	return pullAnswer{Chart: chart}, nil
}

// checkSeedKind: an object of a kind the seed's scheme registers (what gardenlet's and the
// resource manager's clients decode a seed's objects with) into its Go type.
func checkSeedKind(raw []byte, meta typeMeta) error {
	if strings.HasSuffix(schema.FromAPIVersionAndKind(meta.APIVersion, meta.Kind).Group, "gardener.cloud") {
		// Gardener's own kinds are checked above, each by its rules, or not at all.
		return fmt.Errorf("kind %q (apiVersion %q): not a kind this checker knows", meta.Kind, meta.APIVersion)
	}
	into, err := kubernetes.SeedScheme.New(schema.FromAPIVersionAndKind(meta.APIVersion, meta.Kind))
	if err != nil {
		return fmt.Errorf("kind %q (apiVersion %q): not a kind this checker knows", meta.Kind, meta.APIVersion)
	}
	return strict(raw, into)
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
		// Optional in Gardener's type since self-hosted shoots; a seed's Cluster has it.
		{"spec.seed", "Seed", ptr.Deref(cluster.Spec.Seed, runtime.RawExtension{}), &gardencorev1beta1.Seed{}},
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

func forceDeletion(in io.Reader) (any, error) {
	return eachOf(in, "Cluster", func(cluster *extensionsv1alpha1.Cluster) (string, error) {
		shoot, err := extensions.ShootFromCluster(cluster)
		if err != nil {
			return "", fmt.Errorf("ShootFromCluster: %w", err)
		}
		return strconv.FormatBool(v1beta1helper.ShootNeedsForceDeletion(shoot)), nil
	})
}

type conditionRequest struct {
	Extension json.RawMessage `json:"extension"`
	// The controller's heartbeat Lease; null for none (gardenlet then reads the report as
	// outdated, as for a controller that never beat).
	Heartbeat json.RawMessage `json:"heartbeat"`
	// gardenlet's staleExtensionHealthChecks threshold.
	Threshold string `json:"threshold"`
}

type conditionAnswer struct {
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

func shootCondition(in io.Reader) (any, error) {
	var requests []conditionRequest
	if err := json.NewDecoder(in).Decode(&requests); err != nil {
		return nil, fmt.Errorf("stdin: not a JSON array of condition requests: %w", err)
	}
	checker := healthchecker.NewHealthChecker(logr.Discard(), nil, clock.RealClock{})
	out := make([]conditionAnswer, len(requests))
	for i, req := range requests {
		ext := &extensionsv1alpha1.Extension{}
		if err := checkTyped(req.Extension, extensionsv1alpha1.SchemeGroupVersion.String(), "Extension", ext); err != nil {
			return nil, fmt.Errorf("request %d: extension: %w", i, err)
		}
		var heartbeat *metav1.MicroTime
		if len(req.Heartbeat) > 0 && string(req.Heartbeat) != "null" {
			lease := &coordinationv1.Lease{}
			if err := checkTyped(req.Heartbeat, coordinationv1.SchemeGroupVersion.String(), "Lease", lease); err != nil {
				return nil, fmt.Errorf("request %d: heartbeat: %w", i, err)
			}
			heartbeat = lease.Spec.RenewTime
		}
		threshold, err := time.ParseDuration(req.Threshold)
		if err != nil {
			return nil, fmt.Errorf("request %d: threshold: %w", i, err)
		}
		var reports []healthchecker.ExtensionCondition
		for _, c := range ext.Status.Conditions {
			if c.Type == gardencorev1beta1.ShootSystemComponentsHealthy {
				reports = append(reports, healthchecker.ExtensionCondition{
					Condition:          c,
					ExtensionType:      "Extension",
					ExtensionName:      ext.Name,
					ExtensionNamespace: ext.Namespace,
					LastHeartbeatTime:  heartbeat,
				})
			}
		}
		initial := v1beta1helper.InitConditionWithClock(clock.RealClock{}, gardencorev1beta1.ShootSystemComponentsHealthy)
		if c := checker.CheckExtensionCondition(initial, reports, &metav1.Duration{Duration: threshold}); c != nil {
			out[i] = conditionAnswer{Status: string(c.Status), Reason: c.Reason, Message: c.Message}
		}
	}
	return out, nil
}

func joined(errs []string) error {
	if len(errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(errs, "; "))
}

// checkControllerDeployment: both versions Gardener v1.14x serves, each into its own type
// (core.gardener.cloud/v1: helm; v1beta1: type and providerConfig).
func checkControllerDeployment(raw []byte, apiVersion string) error {
	if apiVersion == gardencorev1.SchemeGroupVersion.String() {
		return checkTyped(raw, apiVersion, "ControllerDeployment", &gardencorev1.ControllerDeployment{})
	}
	return checkTyped(raw, coreAPIVersion, "ControllerDeployment", &gardencorev1beta1.ControllerDeployment{})
}

// renderRequest: what gardenlet's ControllerInstallation reconciler renders a chart from.
type renderRequest struct {
	// Archive: the chart as a ControllerDeployment's helm.rawChart carries it (a .tgz).
	Archive []byte `json:"archive"`
	// ReleaseName: gardenlet uses the ControllerRegistration's name.
	ReleaseName string `json:"releaseName"`
	// Namespace: gardenlet's extension-<ControllerInstallation name>.
	Namespace string `json:"namespace"`
	// KubeVersion: the seed's kube-apiserver's, which gardenlet's renderer asks for.
	KubeVersion string `json:"kubeVersion"`
	// Values: the ControllerDeployment's helm.values.
	Values map[string]any `json:"values"`
	// Gardenlet: what gardenlet's own values are made of; nil: the chart gets Values alone.
	Gardenlet *gardenletInputs `json:"gardenlet"`
}

type gardenletInputs struct {
	Seed                  json.RawMessage `json:"seed"`
	GardenerVersion       string          `json:"gardenerVersion"`
	GardenClusterIdentity string          `json:"gardenClusterIdentity"`
}

type renderResponse struct {
	// Files: the rendered chart as gardenlet stores it in the ControllerInstallation's
	// ManagedResource Secret (RenderedChart.AsSecretData).
	Files map[string]string `json:"files"`
	// Values: what the chart was rendered with (Values merged with gardenlet's).
	Values map[string]any `json:"values"`
}

func renderChart(in io.Reader) (any, error) {
	req := renderRequest{}
	body, err := io.ReadAll(in)
	if err != nil {
		return nil, err
	}
	if err := strict(body, &req); err != nil {
		return nil, fmt.Errorf("stdin: %w", err)
	}
	values := req.Values
	if req.Gardenlet != nil {
		injected, err := gardenletValues(req.Gardenlet)
		if err != nil {
			return nil, err
		}
		values = utils.MergeMaps(values, injected)
	}
	renderer, err := newRenderer(req.KubeVersion)
	if err != nil {
		return nil, err
	}
	release, err := renderer.RenderArchive(req.Archive, req.ReleaseName, req.Namespace, values)
	if err != nil {
		return nil, err
	}
	secretData := release.AsSecretData()
	if req.Gardenlet != nil {
		if err := injectSeedName(secretData, req.Namespace, req.Gardenlet); err != nil {
			return nil, err
		}
	}
	files := map[string]string{}
	for name, content := range secretData {
		files[name] = string(content)
	}
	return renderResponse{Files: files, Values: values}, nil
}

// injectSeedName: what gardenlet's reconciler does to the rendered workloads of its own
// namespace before it stores them (its first mutator, for a seed): SEED_NAME in every
// container's env, overwriting one the chart set. Its other mutators are for a garden
// kubeconfig the ControllerDeployment asks for and for self-hosted shoots.
func injectSeedName(secretData map[string][]byte, namespace string, in *gardenletInputs) error {
	seed := &gardencorev1beta1.Seed{}
	if err := json.Unmarshal(in.Seed, seed); err != nil {
		return fmt.Errorf("gardenlet.seed: %w", err)
	}
	return gardenerutils.MutateObjectsInSecretData(
		secretData,
		namespace,
		[]string{appsv1.GroupName, batchv1.GroupName},
		func(obj runtime.Object) error {
			return kubernetesutils.VisitPodSpec(obj, func(podSpec *corev1.PodSpec) {
				kubernetesutils.VisitContainers(podSpec, func(container *corev1.Container) {
					kubernetesutils.AddEnvVar(container, corev1.EnvVar{
						Name:  v1beta1constants.EnvSeedName,
						Value: seed.Name,
					}, true)
				})
			})
		},
	)
}

// imageRequest: an image vector of one entry (name and ref, as a chart names its default) and
// an overwrite in Gardener's image vector format, as a ControllerDeployment's values carry it.
type imageRequest struct {
	Name      string `json:"name"`
	Ref       string `json:"ref"`
	Overwrite string `json:"overwrite"`
}

// imageAnswer: the image found, or why none (an overwrite Gardener refuses, or no image).
type imageAnswer struct {
	Image string `json:"image"`
	Error string `json:"error"`
}

// findImages: each image as a Go extension resolves its own under IMAGEVECTOR_OVERWRITE
// (imagevector.WithEnvOverride: the overwrite read, validated and merged over the vector; then
// FindImage, with no runtime or target version).
func findImages(in io.Reader) (any, error) {
	body, err := io.ReadAll(in)
	if err != nil {
		return nil, err
	}
	var requests []imageRequest
	if err := strict(body, &requests); err != nil {
		return nil, fmt.Errorf("stdin: %w", err)
	}
	out := make([]imageAnswer, len(requests))
	for i, req := range requests {
		image, err := findImage(req)
		if err != nil {
			out[i].Error = err.Error()
			continue
		}
		out[i].Image = image
	}
	return out, nil
}

func findImage(req imageRequest) (string, error) {
	vector := imagevector.ImageVector{{Name: req.Name, Ref: ptr.To(req.Ref)}}
	if req.Overwrite != "" {
		overwrite, _, err := imagevector.Read([]byte(req.Overwrite))
		if err != nil {
			return "", err
		}
		vector = imagevector.MergeImageVectors(vector, overwrite)
	}
	image, err := vector.FindImage(req.Name)
	if err != nil {
		return "", err
	}
	return image.String(), nil
}

func newRenderer(kubeVersion string) (chartrenderer.Interface, error) {
	v, err := version.ParseSemantic(kubeVersion)
	if err != nil {
		return nil, fmt.Errorf("kubeVersion: %w", err)
	}
	return chartrenderer.NewWithServerVersion(&apimachineryversion.Info{
		GitVersion: kubeVersion,
		Major:      fmt.Sprint(v.Major()),
		Minor:      fmt.Sprint(v.Minor()),
	}), nil
}

// gardenletValues: the "gardener" values gardenlet mixes into every chart it renders for a
// seed, built as pkg/gardenlet/controller/controllerinstallation/controllerinstallation/
// reconciler.go builds them (a copy of its map: the reconciler builds it inline). Its feature
// gates are gardenlet's, registered as gardenlet registers them, at their defaults.
func gardenletValues(in *gardenletInputs) (map[string]any, error) {
	seed := &gardencorev1beta1.Seed{}
	if err := checkTyped(in.Seed, coreAPIVersion, "Seed", seed); err != nil {
		return nil, fmt.Errorf("gardenlet.seed: %w", err)
	}
	// gardenlet reads the Seed as gardener-apiserver stores it: defaulted.
	gardencorev1beta1.SetObjectDefaults_Seed(seed)
	if seed.Status.ClusterIdentity == nil {
		return nil, fmt.Errorf("gardenlet.seed: status.clusterIdentity not set (gardenlet refuses to render for it)")
	}
	gardenerMap := map[string]any{
		"version":   in.GardenerVersion,
		"garden":    map[string]any{"clusterIdentity": in.GardenClusterIdentity},
		"gardenlet": map[string]any{"featureGates": gardenletFeatureGates()},
		"seed":      seedValues(seed),
	}
	// Through JSON, as the renderer reads them: the test sees what the chart sees.
	raw, err := json.Marshal(map[string]any{"gardener": gardenerMap})
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	return out, json.Unmarshal(raw, &out)
}

func gardenletFeatureGates() map[featuregate.Feature]bool {
	gardenletfeatures.RegisterFeatureGates() // once: a run renders once
	out := map[featuregate.Feature]bool{}
	for feature := range features.DefaultFeatureGate.GetAll() {
		out[feature] = features.DefaultFeatureGate.Enabled(feature)
	}
	return out
}

func seedValues(seed *gardencorev1beta1.Seed) map[string]any {
	var (
		volumeProvider  string
		volumeProviders []gardencorev1beta1.SeedVolumeProvider
	)
	if seed.Spec.Volume != nil {
		volumeProviders = seed.Spec.Volume.Providers
		if len(seed.Spec.Volume.Providers) > 0 {
			volumeProvider = seed.Spec.Volume.Providers[0].Name
		}
	}
	values := map[string]any{
		"name":            seed.Name,
		"clusterIdentity": *seed.Status.ClusterIdentity,
		"annotations":     seed.Annotations,
		"labels":          seed.Labels,
		"provider":        seed.Spec.Provider.Type,
		"region":          seed.Spec.Provider.Region,
		"volumeProvider":  volumeProvider,
		"volumeProviders": volumeProviders,
		"protected":       v1beta1helper.TaintsHave(seed.Spec.Taints, gardencorev1beta1.SeedTaintProtected),
		"visible":         seed.Spec.Settings.Scheduling.Visible,
		"taints":          seed.Spec.Taints,
		"networks":        seed.Spec.Networks,
		"blockCIDRs":      seed.Spec.Networks.BlockCIDRs,
		"spec":            seed.Spec,
	}
	if seed.Spec.Ingress != nil {
		values["ingressDomain"] = &seed.Spec.Ingress.Domain
	}
	return values
}
