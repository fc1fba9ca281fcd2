package server_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestHTTPServerErrorsAreJSONAndLimited: plaintext requests to the HTTPS
// listener make net/http log a TLS handshake error each; the lines are C4
// http_server_error events of the server's JSON logger (not plain text on
// the standard logger), at most the burst (100) of them in a flood, and the
// rest is counted in lockd_log_lines_dropped_total{source="http"} (C4
// transport events, issue 23 F6).
func TestHTTPServerErrorsAreJSONAndLimited(t *testing.T) {
	dir := t.TempDir()
	ca := testkit.NewCA(t, "server-ca")
	cfg := lockdtest.Config()
	cfg.TLSCertFile, cfg.TLSKeyFile = ca.Issue(t, testkit.CertOptions{}).Write(t, dir, "server")
	log, logs := testkit.NewLogger()
	srv := startHTTP(t, backend.Etcd, lockdtest.Options{Config: &cfg, Logger: log})

	const flood = 300
	for range flood {
		c, err := net.Dial("tcp", srv.HTTPAddr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("GET /v1/locks HTTP/1.1\r\nHost: x\r\n\r\n"))
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, _ = c.Read(make([]byte, 512)) // the server answers (a plaintext 400) and closes
		_ = c.Close()
	}
	count := func() (events, dropped int) {
		for _, e := range logs.Events("http_server_error") {
			if e["listener"] == "http" && strings.Contains(e["error"].(string), "TLS handshake error") {
				events++
			}
		}
		return events, int(counter(t, srv.Registry, "lockd_log_lines_dropped_total", map[string]string{"source": "http"}))
	}
	testkit.Eventually(t, 30*time.Second, "every handshake error logged or counted as dropped", func() bool {
		e, d := count()
		return e+d >= flood
	})
	e, d := count()
	// The rate refills during the flood (10/s): allow what a slow machine
	// adds, far below the flood.
	if e < 1 || e > flood/2 || d < 1 {
		t.Errorf("%d handshake errors: %d http_server_error events, %d dropped; want some events, at most %d, and drops", flood, e, d, flood/2)
	}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if !strings.HasPrefix(line, "{") {
			t.Errorf("a log line is not JSON: %q", line)
		}
	}
}
