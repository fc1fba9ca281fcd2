package cli

import (
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"lock.dev/lockd/internal/testkit"
)

// TestServeMTLSEndToEnd runs `lockd serve` with mTLS on the API and TLS on
// the metrics listener, and client commands with the --tls-* flags and the
// LOCKD_TLS_* variables.
func TestServeMTLSEndToEnd(t *testing.T) {
	dir := t.TempDir()
	ca := testkit.NewCA(t, "lockd-ca")
	caFile := ca.WriteCA(t, dir, "ca.pem")
	srvCert, srvKey := ca.Issue(t, testkit.CertOptions{}).Write(t, dir, "server")
	cliCert, cliKey := ca.Issue(t, testkit.CertOptions{CommonName: "alice"}).Write(t, dir, "alice")
	srv := start(t, nil, "serve", "--data-dir", filepath.Join(dir, "data"),
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--tls-cert-file", srvCert, "--tls-key-file", srvKey, "--tls-client-ca-file", caFile,
		"--metrics-tls-cert-file", srvCert, "--metrics-tls-key-file", srvKey)
	addr, metricsAddr, _ := srv.serving(t)

	flags := []string{"--server", addr, "--tls-ca", caFile, "--tls-cert", cliCert, "--tls-key", cliKey}
	if res := lockd(t, nil, append(append([]string{"run"}, flags...), "tls/job", "--", "true")...); res.code != 0 {
		t.Errorf("lockd run with --tls-* flags: %v", res)
	}
	if res := lockd(t, nil, append([]string{"inspect", "tls/job"}, flags...)...); res.code != 0 ||
		!strings.Contains(res.stdout, "held:      no") {
		t.Errorf("lockd inspect with --tls-* flags: %v", res)
	}
	environ := []string{"LOCKD_SERVER=" + addr, "LOCKD_TLS_CA=" + caFile, "LOCKD_TLS_CERT=" + cliCert,
		"LOCKD_TLS_KEY=" + cliKey, "LOCKD_TLS_SERVER_NAME=localhost"}
	if res := lockd(t, environ, "ls"); res.code != 0 {
		t.Errorf("lockd ls with LOCKD_TLS_*: %v", res)
	}
	// Refused: plaintext, and TLS without a client certificate.
	if res := lockd(t, nil, "inspect", "tls/job", "--server", addr, "--timeout", "1s"); res.code == 0 {
		t.Errorf("lockd inspect in plaintext against a TLS server succeeded: %v", res)
	}
	if res := lockd(t, nil, "inspect", "tls/job", "--server", addr, "--timeout", "1s", "--tls-ca", caFile); res.code == 0 {
		t.Errorf("lockd inspect without a client certificate against client-auth=require succeeded: %v", res)
	}
	if res := lockd(t, nil, "inspect", "tls/job", "--server", addr, "--tls-cert", cliCert); res.code != ExitUsage {
		t.Errorf("--tls-cert without --tls-key: %v, want exit %d", res, ExitUsage)
	}

	// The metrics listener speaks TLS.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	resp, err := hc.Get("https://" + metricsAddr + "/healthz")
	if err != nil {
		t.Fatalf("GET https /healthz: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET https /healthz = %d %q", resp.StatusCode, body)
	}
	// net/http answers a plaintext request on a TLS port with a 400.
	if resp, err := http.Get("http://" + metricsAddr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plaintext GET /healthz on the TLS metrics listener = 200")
		}
	}
}

// TestServeRefusesRemotePlaintext: a non-loopback listen address without
// TLS fails at start, naming the key to set.
func TestServeRefusesRemotePlaintext(t *testing.T) {
	for _, args := range [][]string{
		{"--listen", "0.0.0.0:0"},
		{"--listen", "127.0.0.1:0", "--metrics-listen", "0.0.0.0:0"},
	} {
		res := lockd(t, nil, append([]string{"serve", "--data-dir", t.TempDir()}, args...)...)
		want := "lock.server.tls.cert-file"
		if args[len(args)-2] == "--metrics-listen" {
			want = "lock.server.metrics-tls.cert-file"
		}
		if res.code != ExitError || !strings.Contains(res.stderr, want) || !strings.Contains(res.stderr, "insecure-allow-remote") {
			t.Errorf("serve %v: %v\nwant exit %d naming %s", args, res, ExitError, want)
		}
	}
	// Explicitly allowed: it starts and warns.
	srv := start(t, nil, "serve", "--data-dir", t.TempDir(), "--listen", "0.0.0.0:0", "--metrics-listen", "off",
		"--insecure-allow-remote")
	srv.serving(t)
	if !strings.Contains(srv.stderr.String(), `"msg":"insecure_listener"`) {
		t.Errorf("serve --insecure-allow-remote did not log insecure_listener:\n%s", srv.stderr)
	}
}

// TestServeSIGHUPReloads: one SIGHUP makes `lockd serve` re-read both the
// TLS files of every listener and the access policy (C4 tls_reloaded,
// auth_reloaded), with nothing changed on disk: polling alone reloads
// neither.
func TestServeSIGHUPReloads(t *testing.T) {
	dir := t.TempDir()
	ca := testkit.NewCA(t, "lockd-ca")
	caFile := ca.WriteCA(t, dir, "ca.pem")
	srvCert, srvKey := ca.Issue(t, testkit.CertOptions{}).Write(t, dir, "server")
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte("rules:\n  - name: all\n    principals: [\"*\"]\n    prefixes: [\"*\"]\n    allow: [read, lock, admin]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := start(t, nil, "serve", "--data-dir", filepath.Join(dir, "data"),
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--tls-cert-file", srvCert, "--tls-key-file", srvKey, "--tls-client-ca-file", caFile,
		"--metrics-tls-cert-file", srvCert, "--metrics-tls-key-file", srvKey, "--auth-policy-file", policy)
	srv.serving(t) // the SIGHUP handler is in place before the line
	count := func(event string) int { return strings.Count(srv.stderr.String(), `"msg":"`+event+`"`) }
	tlsBefore, authBefore := count("tls_reloaded"), count("auth_reloaded")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "tls_reloaded for both listeners and auth_reloaded after SIGHUP", func() bool {
		return count("tls_reloaded") >= tlsBefore+2 && count("auth_reloaded") > authBefore
	})
	if strings.Contains(srv.stderr.String(), "reload_failed") {
		t.Errorf("a reload failed:\n%s", srv.stderr)
	}
}
