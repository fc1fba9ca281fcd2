package packaging

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var unitFile = filepath.Join(repoRoot, "deploy", "systemd", "lockd.service")

const unitBinary = "/usr/local/bin/lockd"

// TestSystemdUnitVerify: systemd-analyze verify accepts the unit without a
// single warning (it only warns about an unknown directive), with ExecStart
// pointing at a release build of lockd (verify checks that it exists), and
// systemd-analyze security --offline rates its exposure at most 2.0.
func TestSystemdUnitVerify(t *testing.T) {
	unit, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "ExecStart="+unitBinary+" ") {
		t.Fatalf("%s: ExecStart does not run %s", unitFile, unitBinary)
	}
	dir := t.TempDir()
	local := filepath.Join(dir, "lockd.service")
	if err := os.WriteFile(local, []byte(strings.ReplaceAll(string(unit), unitBinary, lockdBinary(t))), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, dir, os.Environ(), "systemd-analyze", "verify", local)
	if err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify %s: %v\n%s", unitFile, err, out)
	}

	out, err = run(t, dir, os.Environ(), "systemd-analyze", "security", "--offline=true", "--no-pager", local)
	if err != nil {
		t.Fatalf("systemd-analyze security --offline: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for lockd\.service: ([0-9.]+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security printed no overall exposure:\n%s", out)
	}
	if score, _ := strconv.ParseFloat(m[1], 64); score > 2.0 {
		t.Errorf("systemd-analyze security: exposure %s, want at most 2.0\n%s", m[1], out)
	}
	t.Logf("systemd-analyze security --offline: exposure %s", m[1])
}

// TestSystemdUnitHardening: the directives issue 16 asks for are set.
func TestSystemdUnitHardening(t *testing.T) {
	unit, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	section := ""
	for line := range strings.SplitSeq(string(unit), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = line
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Errorf("%s: line %q is not KEY=VALUE", unitFile, line)
			}
			got[section+k] = append(got[section+k], v)
		}
	}
	for k, want := range map[string]string{
		"DynamicUser": "yes", "StateDirectory": "lockd", "ProtectSystem": "strict", "ProtectHome": "yes",
		"PrivateTmp": "yes", "NoNewPrivileges": "yes", "CapabilityBoundingSet": "",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX", "SystemCallFilter": "@system-service",
		"MemoryDenyWriteExecute": "yes", "Restart": "on-failure", "PrivateDevices": "yes",
		"ProtectKernelTunables": "yes", "ProtectControlGroups": "yes", "RestrictNamespaces": "yes",
		"LockPersonality": "yes", "SystemCallArchitectures": "native",
	} {
		vs := got["[Service]"+k]
		found := false
		for _, v := range vs {
			found = found || v == want
		}
		if !found {
			t.Errorf("%s: [Service] %s=%q not set (have %q)", unitFile, k, want, vs)
		}
	}
}

// TestSystemdExampleConfig starts lockd with deploy/systemd/lockd.yaml as
// the unit does (serve --config), the paths the unit provides (credentials,
// state directory) moved into a temp dir and the listeners onto loopback
// through the environment (which C5 puts above the file), then checks
// /healthz with lockd health as configured.
func TestSystemdExampleConfig(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "credentials")
	if err := os.Mkdir(creds, 0o700); err != nil {
		t.Fatal(err)
	}
	tlsFiles(t, creds)
	env := lockdEnv(
		"STATE_DIRECTORY="+filepath.Join(dir, "state"),
		"LOCKD_SERVER_LISTEN=127.0.0.1:0",
		"LOCKD_SERVER_METRICS_LISTEN=127.0.0.1:0",
		"LOCKD_SERVER_TLS_CERT_FILE="+filepath.Join(creds, "tls.crt"),
		"LOCKD_SERVER_TLS_KEY_FILE="+filepath.Join(creds, "tls.key"),
		"LOCKD_SERVER_TLS_CLIENT_CA_FILE="+filepath.Join(creds, "ca.crt"),
		"LOCKD_SERVER_METRICS_TLS_CERT_FILE="+filepath.Join(creds, "tls.crt"),
		"LOCKD_SERVER_METRICS_TLS_KEY_FILE="+filepath.Join(creds, "tls.key"),
	)
	s := serve(t, env, "serve", "--config", filepath.Join(repoRoot, "deploy", "systemd", "lockd.yaml"))
	if s.backnd != "embedded" {
		t.Errorf("lockd.yaml: backend %s, want embedded", s.backnd)
	}
	if !strings.Contains(s.stderr.String(), filepath.Join(dir, "state")) {
		t.Errorf("lockd did not log its data dir $STATE_DIRECTORY (%s):\n%s", filepath.Join(dir, "state"), s.stderr)
	}
	out, err := run(t, dir, setEnv(env, "LOCKD_SERVER_METRICS_LISTEN", s.metrics), lockdBinary(t), "health")
	if err != nil || !strings.HasPrefix(out, "https://"+s.metrics+"/healthz: 200 OK") {
		t.Errorf("lockd health: %v\n%s", err, out)
	}
}

// TestSystemdExampleConfigHTTP starts lockd with deploy/systemd/lockd.yaml
// whose commented HTTP/JSON API and console lines are uncommented, as a
// reader would: the keys must be accepted and the HTTP listener serve.
func TestSystemdExampleConfigHTTP(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "systemd", "lockd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const commented = "    # http:\n    #   listen: 0.0.0.0:7422\n    #   console: true\n"
	if !strings.Contains(string(raw), commented) {
		t.Fatalf("lockd.yaml lacks the commented HTTP/JSON API example:\n%s", commented)
	}
	cfg := strings.Replace(string(raw), commented, "    http:\n      listen: 0.0.0.0:7422\n      console: true\n", 1)
	dir := t.TempDir()
	creds := filepath.Join(dir, "credentials")
	if err := os.Mkdir(creds, 0o700); err != nil {
		t.Fatal(err)
	}
	tlsFiles(t, creds)
	file := filepath.Join(dir, "lockd.yaml")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	env := lockdEnv(
		"STATE_DIRECTORY="+filepath.Join(dir, "state"),
		"LOCKD_SERVER_LISTEN=127.0.0.1:0",
		"LOCKD_SERVER_METRICS_LISTEN=127.0.0.1:0",
		"LOCKD_SERVER_HTTP_LISTEN=127.0.0.1:0",
		"LOCKD_SERVER_TLS_CERT_FILE="+filepath.Join(creds, "tls.crt"),
		"LOCKD_SERVER_TLS_KEY_FILE="+filepath.Join(creds, "tls.key"),
		"LOCKD_SERVER_TLS_CLIENT_CA_FILE="+filepath.Join(creds, "ca.crt"),
		"LOCKD_SERVER_METRICS_TLS_CERT_FILE="+filepath.Join(creds, "tls.crt"),
		"LOCKD_SERVER_METRICS_TLS_KEY_FILE="+filepath.Join(creds, "tls.key"),
	)
	s := serve(t, env, "serve", "--config", file)
	if s.http == "" {
		t.Errorf("lockd with the HTTP example uncommented serves no HTTP listener\nstderr:\n%s", s.stderr)
	}
}
