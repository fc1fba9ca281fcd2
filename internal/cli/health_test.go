package cli

import (
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
)

// TestHealthServe: lockd health against a real lockd serve's /healthz.
func TestHealthServe(t *testing.T) {
	t.Parallel()
	srv := start(t, nil, "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	_, metricsAddr, _ := srv.serving(t)
	url := "http://" + metricsAddr + "/healthz"
	if res := lockd(t, nil, "health", "--url", url); res.code != 0 || res.stdout != url+": 200 OK\n" {
		t.Errorf("lockd health --url %s: %v, want exit 0 and one line", url, res)
	}
	// Without --url: from serve's environment, an unspecified host over loopback.
	_, port, _ := net.SplitHostPort(metricsAddr)
	environ := []string{envMetricsListen + "=0.0.0.0:" + port}
	if res := lockd(t, environ, "health"); res.code != 0 || res.stdout != "http://127.0.0.1:"+port+"/healthz: 200 OK\n" {
		t.Errorf("lockd health with %v: %v, want exit 0", environ, res)
	}
	if res := srv.stop(t, 60*time.Second); res.code != 0 {
		t.Fatalf("lockd serve after cancel: %v", res)
	}
	// Nothing listens any more.
	if res := lockd(t, nil, "health", "--url", url, "--timeout", "2s"); res.code != ExitError {
		t.Errorf("lockd health on a stopped server: %v, want exit %d", res, ExitError)
	}
}

// TestHealthAnswers: non-200 answers, https with and without a CA.
func TestHealthAnswers(t *testing.T) {
	t.Parallel()
	unavailable := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
	}))
	defer unavailable.Close()
	res := lockd(t, nil, "health", "--url", unavailable.URL+"/healthz")
	if res.code != ExitError || !strings.Contains(res.stderr, "503 Service Unavailable") || !strings.Contains(res.stderr, "shutting down") {
		t.Errorf("lockd health on a 503: %v, want exit %d naming the status and body", res, ExitError)
	}

	ok := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }))
	defer ok.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ok.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	// httptest's certificate names 127.0.0.1 and example.com.
	_, port, _ := net.SplitHostPort(ok.Listener.Addr().String())
	url := "https://127.0.0.1:" + port + "/healthz"
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"--tls-ca", ca}, 0},
		{nil, ExitError}, // not signed by a system root
		{[]string{"--insecure-skip-verify"}, 0},
		{[]string{"--tls-ca", filepath.Join(t.TempDir(), "missing.pem")}, ExitError},
	} {
		args := append([]string{"health", "--url", url}, tc.args...)
		if res := lockd(t, nil, args...); res.code != tc.code {
			t.Errorf("lockd %s: %v, want exit %d", strings.Join(args, " "), res, tc.code)
		}
	}
	if res := lockd(t, nil, "health", "--url", "::bad"); res.code != ExitUsage {
		t.Errorf("lockd health --url ::bad: %v, want exit %d", res, ExitUsage)
	}
}

// TestHealthLocalTLS: without --url, lockd health reaches a TLS metrics
// listener found from serve's environment and accepts exactly the
// certificate of $LOCKD_SERVER_METRICS_TLS_CERT_FILE.
func TestHealthLocalTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testkit.NewCA(t, "lockd-ca")
	srvCert, srvKey := ca.Issue(t, testkit.CertOptions{}).Write(t, dir, "server")
	otherCert, _ := ca.Issue(t, testkit.CertOptions{}).Write(t, dir, "other")
	srv := start(t, nil, "serve", "--data-dir", filepath.Join(dir, "data"),
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--metrics-tls-cert-file", srvCert, "--metrics-tls-key-file", srvKey)
	_, metricsAddr, _ := srv.serving(t)
	_, port, _ := net.SplitHostPort(metricsAddr)

	environ := []string{envMetricsListen + "=:" + port, envMetricsTLSCertFile + "=" + srvCert}
	if res := lockd(t, environ, "health"); res.code != 0 || res.stdout != "https://127.0.0.1:"+port+"/healthz: 200 OK\n" {
		t.Errorf("lockd health with %v: %v, want exit 0", environ, res)
	}
	environ = []string{envMetricsListen + "=127.0.0.1:" + port, envMetricsTLSCertFile + "=" + otherCert}
	if res := lockd(t, environ, "health"); res.code != ExitError || !strings.Contains(res.stderr, "not the one in") {
		t.Errorf("lockd health pinned to another certificate: %v, want exit %d", res, ExitError)
	}
	if res := srv.stop(t, 60*time.Second); res.code != 0 {
		t.Fatalf("lockd serve after cancel: %v", res)
	}
}

func TestLocalHealthURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		environ  []string
		url      string
		certFile string
		code     int // of the error, 0 for none
	}{
		{nil, "http://127.0.0.1:7421/healthz", "", 0},
		{[]string{envMetricsListen + "=0.0.0.0:9000"}, "http://127.0.0.1:9000/healthz", "", 0},
		{[]string{envMetricsListen + "=[::]:9000"}, "http://[::1]:9000/healthz", "", 0},
		{[]string{envMetricsListen + "=lockd.example:9000", envMetricsTLSCertFile + "=/c.pem"}, "https://lockd.example:9000/healthz", "/c.pem", 0},
		{[]string{envMetricsListen + "=off"}, "", "", ExitUsage},
		{[]string{envMetricsListen + "=9000"}, "", "", ExitUsage},
	} {
		e := &env{environ: func() []string { return tc.environ }}
		url, certFile, err := localHealth(e)
		var ee *exitError
		switch {
		case tc.code == 0 && err != nil:
			t.Errorf("localHealth(%v): %v", tc.environ, err)
		case tc.code != 0 && (!errors.As(err, &ee) || ee.code != tc.code):
			t.Errorf("localHealth(%v) error = %v, want exit %d", tc.environ, err, tc.code)
		case url != tc.url || certFile != tc.certFile:
			t.Errorf("localHealth(%v) = %q, %q; want %q, %q", tc.environ, url, certFile, tc.url, tc.certFile)
		}
	}
}
