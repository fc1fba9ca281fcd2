package cli

import (
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHealthServe: lockd health against a real lockd serve's /healthz.
func TestHealthServe(t *testing.T) {
	srv := start(t, nil, "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	_, metricsAddr, _ := srv.serving(t)
	url := "http://" + metricsAddr + "/healthz"
	if res := lockd(t, nil, "health", "--url", url); res.code != 0 || res.stdout != url+": 200 OK\n" {
		t.Errorf("lockd health --url %s: %v, want exit 0 and one line", url, res)
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
