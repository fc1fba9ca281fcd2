package packaging

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

var containerfile = filepath.Join(repoRoot, "deploy", "container", "Containerfile")

// parseContainerfile parses the Containerfile with BuildKit's parser into
// typed stages; every warning of the parser and of BuildKit's linter (the
// parse-time rules of `docker build --check`) fails the test.
func parseContainerfile(t *testing.T) []instructions.Stage {
	t.Helper()
	data, err := os.ReadFile(containerfile)
	if err != nil {
		t.Fatal(err)
	}
	res, err := parser.Parse(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("parse %s: %v", containerfile, err)
	}
	for _, w := range res.Warnings {
		t.Errorf("%s: parser warning: %s", containerfile, w.Short)
	}
	lint := linter.New(&linter.Config{Warn: func(rule, _, _, msg string, loc []parser.Range) {
		t.Errorf("%s:%v: lint %s: %s", containerfile, loc, rule, msg)
	}})
	stages, _, err := instructions.Parse(res.AST, lint)
	if err != nil {
		t.Fatalf("parse %s: %v", containerfile, err)
	}
	return stages
}

func commandsOf[C any](s instructions.Stage) []C {
	var out []C
	for _, c := range s.Commands {
		if c, ok := c.(C); ok {
			out = append(out, c)
		}
	}
	return out
}

// TestContainerfileRules: multi-stage; a static, trimmed, stripped,
// stamped build; a distroless or scratch final stage with a non-root
// numeric USER, the data VOLUME, the ports, a HEALTHCHECK run by lockd
// itself (no curl there); no ADD anywhere (no remote sources).
func TestContainerfileRules(t *testing.T) {
	stages := parseContainerfile(t)
	if len(stages) < 2 {
		t.Fatalf("%s: %d stage(s), want a build stage and a final one", containerfile, len(stages))
	}
	final := stages[len(stages)-1]
	if !strings.HasPrefix(final.BaseName, "gcr.io/distroless/static") && final.BaseName != "scratch" {
		t.Errorf("final stage FROM %s, want distroless/static or scratch", final.BaseName)
	}
	var buildRuns []string
	for _, s := range stages[:len(stages)-1] {
		for _, r := range commandsOf[*instructions.RunCommand](s) {
			buildRuns = append(buildRuns, strings.Join(r.CmdLine, " "))
		}
	}
	build := strings.Join(buildRuns, "\n")
	for _, want := range []string{"CGO_ENABLED=0", "go build", "-trimpath", "-s -w", "internal/cli.version=", "internal/cli.commit="} {
		if !strings.Contains(build, want) {
			t.Errorf("build stage RUN lacks %q", want)
		}
	}
	for _, s := range stages {
		if adds := commandsOf[*instructions.AddCommand](s); len(adds) > 0 {
			t.Errorf("stage %q uses ADD (%v): use COPY", s.Name, adds[0].SourcePaths)
		}
	}
	if runs := commandsOf[*instructions.RunCommand](final); len(runs) > 0 {
		t.Errorf("final stage has RUN %q: the final image has no shell", runs[0].CmdLine)
	}

	users := commandsOf[*instructions.UserCommand](final)
	if len(users) == 0 {
		t.Fatal("final stage has no USER: the image would run as root")
	}
	uid, _, _ := strings.Cut(users[len(users)-1].User, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("final USER %q: want a numeric non-root uid (Kubernetes runAsNonRoot checks numbers)", users[len(users)-1].User)
	}
	var volumes, ports []string
	for _, v := range commandsOf[*instructions.VolumeCommand](final) {
		volumes = append(volumes, v.Volumes...)
	}
	for _, e := range commandsOf[*instructions.ExposeCommand](final) {
		ports = append(ports, e.Ports...)
	}
	if !slices.Contains(volumes, "/var/lib/lockd") {
		t.Errorf("final stage VOLUME %v lacks /var/lib/lockd", volumes)
	}
	for _, p := range []string{"7420", "7421", "7422"} {
		if !slices.Contains(ports, p) {
			t.Errorf("final stage EXPOSE %v lacks %s", ports, p)
		}
	}
	entry := entrypoint(t, final)
	hc := healthcheck(t, final)
	if hc[0] != entry[0] || len(hc) < 2 || hc[1] != "health" {
		t.Errorf("HEALTHCHECK CMD %q: want %s health (no curl in the image)", hc, entry[0])
	}
}

func entrypoint(t *testing.T, s instructions.Stage) []string {
	t.Helper()
	eps := commandsOf[*instructions.EntrypointCommand](s)
	if len(eps) == 0 || eps[len(eps)-1].PrependShell {
		t.Fatal("final stage: want an exec-form ENTRYPOINT (there is no shell)")
	}
	return eps[len(eps)-1].CmdLine
}

func healthcheck(t *testing.T, s instructions.Stage) []string {
	t.Helper()
	hcs := commandsOf[*instructions.HealthCheckCommand](s)
	if len(hcs) == 0 {
		t.Fatal("final stage has no HEALTHCHECK")
	}
	test := hcs[len(hcs)-1].Health.Test
	if len(test) < 2 || test[0] != "CMD" {
		t.Fatalf("HEALTHCHECK %q: want the exec form CMD [...] (there is no shell)", test)
	}
	return test[1:]
}

// TestContainerfileRuns runs what the image would: ENTRYPOINT + CMD of the
// final stage with its ENV (the TLS directory and the data volume moved to
// a temp dir, the listeners to loopback), then its HEALTHCHECK command with
// the same environment; once in the default mutual-TLS mode, once in the
// plaintext mode its comments show (TLS variables blanked,
// LOCKD_SERVER_INSECURE_ALLOW_REMOTE=true).
func TestContainerfileRuns(t *testing.T) {
	stages := parseContainerfile(t)
	final := stages[len(stages)-1]
	var env []string
	for _, e := range commandsOf[*instructions.EnvCommand](final) {
		for _, kv := range e.Env {
			env = append(env, kv.Key+"="+kv.Value)
		}
	}
	var args []string
	if cmds := commandsOf[*instructions.CmdCommand](final); len(cmds) > 0 {
		args = cmds[len(cmds)-1].CmdLine
	}
	args = append(entrypoint(t, final)[1:], args...)
	hc := healthcheck(t, final)

	for _, mode := range []struct {
		name   string
		extra  []string
		scheme string
	}{
		{"mtls", nil, "https"},
		{"plaintext", []string{"LOCKD_SERVER_TLS_CERT_FILE=", "LOCKD_SERVER_TLS_KEY_FILE=", "LOCKD_SERVER_TLS_CLIENT_CA_FILE=",
			"LOCKD_SERVER_METRICS_TLS_CERT_FILE=", "LOCKD_SERVER_METRICS_TLS_KEY_FILE=", "LOCKD_SERVER_INSECURE_ALLOW_REMOTE=true"}, "http"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			dir := t.TempDir()
			tlsDir := filepath.Join(dir, "tls")
			if err := os.Mkdir(tlsDir, 0o700); err != nil {
				t.Fatal(err)
			}
			tlsFiles(t, tlsDir)
			e := localize(env, map[string]string{"/etc/lockd/tls": tlsDir, "/var/lib/lockd": filepath.Join(dir, "data")})
			for _, kv := range mode.extra {
				k, v, _ := strings.Cut(kv, "=")
				e = setEnv(e, k, v)
			}
			e = append(lockdEnv(), e...)
			s := serve(t, e, args...)
			if s.backnd != "embedded" {
				t.Errorf("image default backend %s, want embedded", s.backnd)
			}
			out, err := run(t, dir, setEnv(e, "LOCKD_SERVER_METRICS_LISTEN", s.metrics), lockdBinary(t), hc[1:]...)
			if want := mode.scheme + "://" + s.metrics + "/healthz: 200 OK"; err != nil || !strings.HasPrefix(out, want) {
				t.Errorf("HEALTHCHECK %q: %v\n%s\nwant %s", hc, err, out, want)
			}
		})
	}
}
