// Package kubernetes_test checks the example manifests in this directory: every field
// against the Kubernetes API's types (strict decoding: an unknown or misspelt field, a
// wrong type fails), and the relations docs/deployment.md explains against the worker's
// documented settings (docs/configuration.md). It is a module of its own, so that the
// worker's module does not depend on the Kubernetes API.
package kubernetes_test

import (
	"bytes"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// manifests reads every YAML document of the directory's .yaml files, decoded strictly
// into the API type its kind names.
func manifests(t *testing.T) map[string]any {
	t.Helper()
	files, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), ".yaml") {
			continue
		}
		raw, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(raw, []byte("\n---\n")) {
			var head unstructured.Unstructured
			if err := yaml.Unmarshal(doc, &head.Object); err != nil {
				t.Fatalf("%s, document %d: %v", f.Name(), i+1, err)
			}
			var obj any
			switch head.GetKind() {
			case "Deployment":
				obj = &appsv1.Deployment{}
			case "PodDisruptionBudget":
				obj = &policyv1.PodDisruptionBudget{}
			case "Job":
				obj = &batchv1.Job{}
			default:
				t.Fatalf("%s, document %d: kind %q has no check here", f.Name(), i+1, head.GetKind())
			}
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Errorf("%s, document %d (%s): %v", f.Name(), i+1, head.GetKind(), err)
				continue
			}
			out[head.GetKind()+"/"+head.GetName()] = obj
		}
	}
	return out
}

// documented reads docs/configuration.md: the variables it documents, and those a
// _FILE may give (its "Secrets from files" paragraph).
func documented(t *testing.T) (vars, fileVars map[string]bool) {
	t.Helper()
	raw, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	vars, fileVars = map[string]bool{}, map[string]bool{}
	for _, m := range regexp.MustCompile("`(EXTWORKER_[A-Z0-9_]+)`").FindAllStringSubmatch(doc, -1) {
		vars[m[1]] = true
	}
	i := strings.Index(doc, "### Secrets from files")
	if i < 0 {
		t.Fatal("docs/configuration.md has no \"Secrets from files\" section")
	}
	para := doc[i:]
	para = para[:strings.Index(para, "\n\n## ")]
	for _, m := range regexp.MustCompile("`(EXTWORKER_[A-Z0-9_]+)`").FindAllStringSubmatch(para, -1) {
		fileVars[m[1]] = true
	}
	return vars, fileVars
}

func TestManifestsDecodeStrictly(t *testing.T) {
	got := manifests(t)
	for _, want := range []string{"Deployment/extworker", "PodDisruptionBudget/extworker", "Job/extworker-migrate"} {
		if got[want] == nil {
			t.Errorf("%s missing", want)
		}
	}
}

// Every variable the manifests set is one the worker reads, and a _FILE only where the
// worker reads one.
func TestManifestsSetDocumentedVariables(t *testing.T) {
	vars, fileVars := documented(t)
	check := func(where string, env []corev1.EnvVar) {
		for _, e := range env {
			name, file := strings.CutSuffix(e.Name, "_FILE")
			switch {
			case file && !fileVars[name]:
				t.Errorf("%s: %s: the worker reads no _FILE for %s", where, e.Name, name)
			case !file && !vars[e.Name]:
				t.Errorf("%s: %s is not documented in docs/configuration.md", where, e.Name)
			}
		}
	}
	m := manifests(t)
	for _, c := range m["Deployment/extworker"].(*appsv1.Deployment).Spec.Template.Spec.Containers {
		check("Deployment/extworker "+c.Name, c.Env)
	}
	for _, c := range m["Job/extworker-migrate"].(*batchv1.Job).Spec.Template.Spec.Containers {
		check("Job/extworker-migrate "+c.Name, c.Env)
	}
}

// The relations docs/deployment.md explains.
func TestWorkerDeploymentRelations(t *testing.T) {
	m := manifests(t)
	d := m["Deployment/extworker"].(*appsv1.Deployment)
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	dur := func(name string) time.Duration {
		v, err := time.ParseDuration(env[name])
		if err != nil {
			t.Fatalf("%s=%q: %v", name, env[name], err)
		}
		return v
	}

	// The kubelet's SIGKILL comes after the grace period: the worker's whole shutdown
	// (its pending long poll, then SHUTDOWN_TIMEOUT) must fit, with a margin.
	need := dur("EXTWORKER_LONG_POLL") + dur("EXTWORKER_SHUTDOWN_TIMEOUT") + 5*time.Second
	if pod.TerminationGracePeriodSeconds == nil || time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second < need {
		t.Errorf("terminationGracePeriodSeconds %v: must be at least long poll + shutdown timeout + 5s = %v", pod.TerminationGracePeriodSeconds, need)
	}
	if dur("EXTWORKER_SHUTDOWN_TIMEOUT") <= dur("EXTWORKER_SHUTDOWN_GRACE") {
		t.Error("EXTWORKER_SHUTDOWN_TIMEOUT must be longer than EXTWORKER_SHUTDOWN_GRACE")
	}

	// The probes reach the operations endpoints, which must listen on the pod's address.
	if !strings.HasPrefix(env["EXTWORKER_HTTP_ADDR"], ":") {
		t.Errorf("EXTWORKER_HTTP_ADDR %q: the probes need the pod's address (\":PORT\"), not loopback", env["EXTWORKER_HTTP_ADDR"])
	}
	port := strings.TrimPrefix(env["EXTWORKER_HTTP_ADDR"], ":")
	for name, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != name {
			t.Errorf("want a probe GET %s", name)
			continue
		}
		if got := probePort(c, p.HTTPGet.Port); got != port {
			t.Errorf("the %s probe goes to port %s, the operations endpoints listen on %s", name, got, port)
		}
	}

	// The worker id is unique per pod.
	for _, e := range c.Env {
		if e.Name == "EXTWORKER_WORKER_ID" && (e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name") {
			t.Error("EXTWORKER_WORKER_ID must differ per pod (metadata.name), or be left out")
		}
	}

	// The disruption budget covers the worker's pods and leaves the others running.
	pdb := m["PodDisruptionBudget/extworker"].(*policyv1.PodDisruptionBudget)
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Error("the PodDisruptionBudget's selector does not match the worker's pods")
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() >= int(*d.Spec.Replicas) {
		t.Error("the PodDisruptionBudget must keep at least one worker running")
	}

	// Non-root, as the image is built (Dockerfile: distroless nonroot).
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
		t.Error("the pod must run as non-root")
	}
}

// probePort is the container port a probe's port (a number or a port's name) names.
func probePort(c corev1.Container, p intstr.IntOrString) string {
	if p.Type == intstr.String {
		for _, cp := range c.Ports {
			if cp.Name == p.StrVal {
				return strconv.Itoa(int(cp.ContainerPort))
			}
		}
		return "(no port named " + p.StrVal + ")"
	}
	return p.String()
}
