package packaging

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

var chartDir = filepath.Join(repoRoot, "deploy", "helm", "lockd")

// helm runs the helm of this module's go.mod tool line (a pinned version)
// and returns what it wrote on stdout; on failure, stderr follows. Only
// stdout is helm's answer: on a machine whose module cache is cold, `go
// tool` first downloads and builds helm and says so on stderr ("go:
// downloading …"), which a combined output put in front of the manifests
// (a clean-clone run on a fresh machine failed TestHelmChartEnvRuns with
// "document 0: unexpected").
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", append([]string{"tool", "helm"}, args...)...)
	cmd.Dir = wd
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

// chartCase is one values combination of the chart.
type chartCase struct {
	name     string
	set      []string
	kind     string // StatefulSet or Deployment
	replicas int32
	tls      bool
}

var chartCases = []chartCase{
	{"embedded-mtls", nil, "StatefulSet", 1, true},
	{"embedded-plaintext", []string{"tls.secretName=", "insecureAllowRemote=true"}, "StatefulSet", 1, false},
	{"etcd", []string{"mode=etcd", "replicas=3", "etcd.endpoints={https://etcd-0.etcd:2379,https://etcd-1.etcd:2379}",
		"etcd.tlsSecretName=etcd-client", "etcd.username=lockd", "etcd.passwordSecret.name=etcd-password"}, "Deployment", 3, true},
	{"etcd-server-ca-only", []string{"mode=etcd", "etcd.endpoints={https://etcd:2379}", "etcd.tlsSecretName=etcd-ca",
		"etcd.tlsClientCert=false"}, "Deployment", 3, true},
	{"pg", []string{"mode=pg", "replicas=2", "pg.dsnSecret.name=lockd-pg", "tls.clientAuth=none", "insecureAllowRemote=true"}, "Deployment", 2, true},
	{"embedded-http-console", []string{"http.enabled=true", "http.console=true"}, "StatefulSet", 1, true},
	{"pg-http", []string{"mode=pg", "pg.dsnSecret.name=lockd-pg", "http.enabled=true"}, "Deployment", 3, true},
}

// httpOn reports whether a case turns the HTTP/JSON API on.
func (tc chartCase) httpOn() bool { return slices.Contains(tc.set, "http.enabled=true") }

func setArgs(set []string) []string {
	var args []string
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return args
}

// rendered is one helm template output, decoded.
type rendered struct {
	statefulSets []*appsv1.StatefulSet
	deployments  []*appsv1.Deployment
	services     []*corev1.Service
	pdbs         []*policyv1.PodDisruptionBudget
	accounts     []*corev1.ServiceAccount
}

// decodeStrict decodes every document of a helm template output into its
// k8s.io/api type, rejecting unknown and duplicate fields (a misspelt or
// misplaced field fails here, as kubectl's server-side validation would).
func decodeStrict(t *testing.T, manifests string) rendered {
	t.Helper()
	var r rendered
	for i, doc := range strings.Split(manifests, "\n---") {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		var obj any
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 StatefulSet":
			o := &appsv1.StatefulSet{}
			r.statefulSets, obj = append(r.statefulSets, o), o
		case "apps/v1 Deployment":
			o := &appsv1.Deployment{}
			r.deployments, obj = append(r.deployments, o), o
		case "v1 Service":
			o := &corev1.Service{}
			r.services, obj = append(r.services, o), o
		case "policy/v1 PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			r.pdbs, obj = append(r.pdbs, o), o
		case "v1 ServiceAccount":
			o := &corev1.ServiceAccount{}
			r.accounts, obj = append(r.accounts, o), o
		default:
			t.Fatalf("document %d: unexpected %s %s (add its type to decodeStrict)", i, meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Errorf("document %d (%s): %v\n%s", i, meta.Kind, err, doc)
		}
	}
	return r
}

func stripComments(doc string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// TestHelmChart lints and renders the chart for each mode and checks the
// rendered objects: the workload kind and replicas of the mode, probes on
// /healthz, a non-root read-only container, the volumes it needs.
func TestHelmChart(t *testing.T) {
	out, err := helm(t, "version", "--short")
	if err != nil {
		t.Fatalf("helm version: %v\n%s", err, out)
	}
	t.Logf("helm %s", strings.TrimSpace(out))
	for _, tc := range chartCases {
		t.Run(tc.name, func(t *testing.T) {
			if out, err := helm(t, append([]string{"lint", "--strict", chartDir}, setArgs(tc.set)...)...); err != nil {
				t.Fatalf("helm lint --strict: %v\n%s", err, out)
			}
			out, err := helm(t, append([]string{"template", "rel", chartDir, "--namespace", "locks"}, setArgs(tc.set)...)...)
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			r := decodeStrict(t, out)
			checkChart(t, tc, r)
		})
	}
}

func checkChart(t *testing.T, tc chartCase, r rendered) {
	t.Helper()
	var pod corev1.PodTemplateSpec
	var replicas int32
	switch tc.kind {
	case "StatefulSet":
		if len(r.statefulSets) != 1 || len(r.deployments) != 0 {
			t.Fatalf("%d StatefulSets and %d Deployments, want one StatefulSet", len(r.statefulSets), len(r.deployments))
		}
		sts := r.statefulSets[0]
		pod, replicas = sts.Spec.Template, *sts.Spec.Replicas
		if len(sts.Spec.VolumeClaimTemplates) != 1 || sts.Spec.VolumeClaimTemplates[0].Name != "data" {
			t.Errorf("StatefulSet volumeClaimTemplates %v, want one named data", sts.Spec.VolumeClaimTemplates)
		}
		if !hasService(r, sts.Spec.ServiceName) {
			t.Errorf("StatefulSet serviceName %q: no such Service rendered", sts.Spec.ServiceName)
		}
	case "Deployment":
		if len(r.deployments) != 1 || len(r.statefulSets) != 0 {
			t.Fatalf("%d Deployments and %d StatefulSets, want one Deployment", len(r.deployments), len(r.statefulSets))
		}
		d := r.deployments[0]
		pod, replicas = d.Spec.Template, *d.Spec.Replicas
		if len(r.pdbs) != 1 {
			t.Errorf("%d PodDisruptionBudgets, want 1 for %d replicas", len(r.pdbs), replicas)
		}
	}
	if replicas != tc.replicas {
		t.Errorf("%s replicas %d, want %d", tc.kind, replicas, tc.replicas)
	}
	if len(r.accounts) != 1 || r.accounts[0].AutomountServiceAccountToken == nil || *r.accounts[0].AutomountServiceAccountToken {
		t.Error("want one ServiceAccount with automountServiceAccountToken: false")
	}

	ps := pod.Spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser == 0 {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and a non-zero runAsUser", ps)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("container securityContext %+v: want readOnlyRootFilesystem, no privilege escalation, drop ALL", sc)
	}
	scheme := corev1.URISchemeHTTP
	if tc.tls {
		scheme = corev1.URISchemeHTTPS
	}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.String() != "metrics" || p.HTTPGet.Scheme != scheme {
			t.Errorf("%s probe %+v: want GET %s /healthz on port metrics", name, p, scheme)
		}
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	for name := range mounts {
		if _, ok := volumes[name]; !ok && name != "data" {
			t.Errorf("volumeMount %s has no volume", name)
		}
	}
	if tc.kind == "StatefulSet" && mounts["data"] != "/var/lib/lockd" {
		t.Errorf("data volume mounted at %q, want /var/lib/lockd", mounts["data"])
	}
	if tc.kind == "Deployment" && mounts["data"] != "" {
		t.Error("a Deployment mounts a data volume: replicas must not share an embedded etcd")
	}
	if tls := volumes["tls"]; tc.tls != (tls.Secret != nil) || tc.tls && mounts["tls"] != "/etc/lockd/tls" {
		t.Errorf("tls secret volume %+v mounted at %q; want it (at /etc/lockd/tls) iff TLS is on (%v)", tls, mounts["tls"], tc.tls)
	}
	checkHTTP(t, tc, c, r)
}

// checkHTTP: the HTTP/JSON API (and the console) is opt-in: its listen
// variable, container port and Service port `http` are rendered iff
// http.enabled, the console variable as set.
func checkHTTP(t *testing.T, tc chartCase, c corev1.Container, r rendered) {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	wantListen, wantConsole := "", ""
	if tc.httpOn() {
		wantListen, wantConsole = "0.0.0.0:7422", "false"
		if slices.Contains(tc.set, "http.console=true") {
			wantConsole = "true"
		}
	}
	if env["LOCKD_SERVER_HTTP_LISTEN"] != wantListen || env["LOCKD_SERVER_HTTP_CONSOLE"] != wantConsole {
		t.Errorf("LOCKD_SERVER_HTTP_LISTEN %q, LOCKD_SERVER_HTTP_CONSOLE %q; want %q, %q",
			env["LOCKD_SERVER_HTTP_LISTEN"], env["LOCKD_SERVER_HTTP_CONSOLE"], wantListen, wantConsole)
	}
	port := false
	for _, p := range c.Ports {
		if p.Name == "http" {
			port = p.ContainerPort == 7422
		}
	}
	if port != tc.httpOn() {
		t.Errorf("container port http (7422) rendered %v, want %v", port, tc.httpOn())
	}
	svc := false
	for _, s := range r.services {
		if s.Spec.ClusterIP == corev1.ClusterIPNone {
			continue // the headless Service of the StatefulSet: gRPC only
		}
		for _, p := range s.Spec.Ports {
			if p.Name == "http" && p.Port == 7422 && p.TargetPort.String() == "http" {
				svc = true
			}
		}
	}
	if svc != tc.httpOn() {
		t.Errorf("Service port http (7422 -> http) rendered %v, want %v", svc, tc.httpOn())
	}
}

func hasService(r rendered, name string) bool {
	for _, s := range r.services {
		if s.Name == name {
			return true
		}
	}
	return false
}

// TestHelmChartRefuses: values lockd would refuse fail the render with a
// message naming what to set.
func TestHelmChartRefuses(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"mode=raft"}, "mode must be embedded, etcd or pg"},
		{[]string{"mode=etcd"}, "mode etcd needs etcd.endpoints"},
		{[]string{"mode=pg"}, "mode pg needs pg.dsnSecret.name"},
		{[]string{"tls.secretName="}, "set tls.secretName, or insecureAllowRemote=true"},
		{[]string{"http.console=true"}, "http.console needs http.enabled"},
		{[]string{"tls.clientAuth=none"}, "tls.clientAuth none lets clients without a certificate in as anonymous"},
		{[]string{"tls.clientAuth=request"}, "tls.clientAuth request lets clients without a certificate in as anonymous"},
	} {
		out, err := helm(t, append([]string{"template", "rel", chartDir}, setArgs(tc.set)...)...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("helm template --set %v: %v, want an error with %q\n%s", tc.set, err, tc.want, out)
		}
	}
}

// TestHelmChartEnvRuns runs lockd with the container environment the chart
// renders in embedded mode (both TLS settings, and with the HTTP/JSON API
// and console): every LOCKD_* variable must be a C5 key lockd accepts, the
// probe's /healthz must answer, and the HTTP listener must serve iff on.
func TestHelmChartEnvRuns(t *testing.T) {
	for _, tc := range chartCases {
		if tc.kind != "StatefulSet" {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			out, err := helm(t, append([]string{"template", "rel", chartDir}, setArgs(tc.set)...)...)
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			r := decodeStrict(t, out)
			if len(r.statefulSets) != 1 {
				t.Fatalf("%d StatefulSets, want 1", len(r.statefulSets))
			}
			c := r.statefulSets[0].Spec.Template.Spec.Containers[0]
			var env []string
			for _, e := range c.Env {
				if e.ValueFrom != nil {
					t.Fatalf("env %s from a reference: not runnable here", e.Name)
				}
				env = append(env, e.Name+"="+e.Value)
			}
			dir := t.TempDir()
			tlsDir := filepath.Join(dir, "tls")
			if err := os.Mkdir(tlsDir, 0o700); err != nil {
				t.Fatal(err)
			}
			tlsFiles(t, tlsDir)
			env = append(lockdEnv(), localize(env, map[string]string{"/etc/lockd/tls": tlsDir, "/var/lib/lockd": filepath.Join(dir, "data")})...)
			s := serve(t, env, c.Args...)
			scheme := "http"
			if tc.tls {
				scheme = "https"
			}
			out, err = run(t, dir, setEnv(env, "LOCKD_SERVER_METRICS_LISTEN", s.metrics), lockdBinary(t), "health")
			if want := fmt.Sprintf("%s://%s/healthz: 200 OK", scheme, s.metrics); err != nil || !strings.HasPrefix(out, want) {
				t.Errorf("lockd health with the chart's env: %v\n%s\nwant %s", err, out, want)
			}
			if (s.http != "") != tc.httpOn() {
				t.Errorf("lockd with the chart's env serves HTTP at %q; want an HTTP listener iff http.enabled (%v)", s.http, tc.httpOn())
			}
		})
	}
}
