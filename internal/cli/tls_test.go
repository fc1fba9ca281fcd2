package cli

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestServeMTLSEndToEnd runs `lockd serve` with mTLS on the API and TLS on
// the metrics listener, and client commands with the --tls-* flags and the
// LOCKD_TLS_* variables.
func TestServeMTLSEndToEnd(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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

// TestServeSIGHUPReloadsEtcdTLS: SIGHUP makes `lockd serve` re-read its
// lock.etcd.tls.* files (C5 #ct5-tls), here where nothing on disk shows the
// change: every version of the three files has one size and one
// modification time, so the check at each handshake sees none and only
// the SIGHUP reload can put the rotated files in force. etcd restarts with
// a certificate of another CA and trusts only that CA's clients, so lockd
// reaches it again only through a new handshake with the rotated files.
func TestServeSIGHUPReloadsEtcdTLS(t *testing.T) {
	ca1, ca2 := testkit.NewCA(t, "etcd-ca-1"), testkit.NewCA(t, "etcd-ca-2")
	etcd := etcdtest.StartMTLS(t, ca1)
	dir := t.TempDir()
	stamp := time.Unix(1_700_000_000, 0)
	write := func(name string, pem []byte) string { // padded to 4 KiB: PEM readers skip blank lines
		t.Helper()
		path := filepath.Join(dir, name)
		if len(pem) > 4096 {
			t.Fatalf("%s: %d bytes of PEM, more than the 4096 of the padded file", name, len(pem))
		}
		padded := append(append([]byte(nil), pem...), strings.Repeat("\n", 4096-len(pem))...)
		if err := os.WriteFile(path+".tmp", padded, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path+".tmp", stamp, stamp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
		return path
	}
	a := ca1.Issue(t, testkit.CertOptions{CommonName: "lockd-a"})
	caFile, certFile, keyFile := write("ca.pem", ca1.PEM), write("lockd.crt", a.CertPEM), write("lockd.key", a.KeyPEM)
	srv := start(t, nil, "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "off",
		"--backend", "etcd", "--etcd-endpoints", strings.Join(etcd.Endpoints(), ","),
		"--etcd-tls-ca-file", caFile, "--etcd-tls-cert-file", certFile, "--etcd-tls-key-file", keyFile)
	addr, _, _ := srv.serving(t) // the SIGHUP handler is in place before the line
	inspect := func(timeout string) result {
		return lockd(t, nil, "inspect", "sighup/k", "--server", addr, "--timeout", timeout)
	}
	if res := inspect("10s"); res.code != 0 {
		t.Fatalf("lockd inspect before rotation: %v", res)
	}

	etcd.Stop()
	b := ca2.Issue(t, testkit.CertOptions{CommonName: "lockd-b"})
	write("ca.pem", ca2.PEM)
	write("lockd.crt", b.CertPEM)
	write("lockd.key", b.KeyPEM)
	etcd.Start(t, ca2)
	// Before SIGHUP lockd still presents certificate A, which etcd refuses.
	if res := inspect("2s"); res.code == 0 {
		t.Fatalf("lockd inspect succeeded before SIGHUP: the rotated files were seen without it")
	}
	reloaded := func() int { return strings.Count(srv.stderr.String(), `"msg":"tls_reloaded","listener":"etcd"`) }
	if n := reloaded(); n != 0 {
		t.Fatalf("tls_reloaded listener etcd logged %d times before SIGHUP, want 0 (the files look unchanged):\n%s", n, srv.stderr)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "tls_reloaded listener etcd after SIGHUP", func() bool { return reloaded() >= 1 })
	// Bound: lockd's etcd client redials within its reconnect backoff (at
	// most 1 s, etcdstore.ClientConfig); 30 s leaves room for a loaded
	// 2-core machine running -race.
	testkit.Eventually(t, 30*time.Second, "lockd inspect through a new etcd connection with the rotated files", func() error {
		if res := inspect("2s"); res.code != 0 {
			return fmt.Errorf("%v", res)
		}
		return nil
	})
	if strings.Contains(srv.stderr.String(), "reload_failed") {
		t.Errorf("a reload failed:\n%s", srv.stderr)
	}
}
