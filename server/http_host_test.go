package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"lock.dev/lockd/internal/testing/lockdtest"
)

// TestHTTPLoopbackHost: a listener bound to loopback answers only requests
// whose Host is "localhost" or a loopback IP (C5 #ct5-http, DNS
// rebinding); a request carrying another name (what a rebound page sends)
// is refused with 421 PERMISSION_DENIED, the console included, and every
// answer, refusals included, carries X-Content-Type-Options: nosniff.
func TestHTTPLoopbackHost(t *testing.T) {
	cfg := lockdtest.Config()
	cfg.HTTPConsole = true
	srv := startHTTP(t, lockdtest.Backends[0], lockdtest.Options{Config: &cfg})
	_, port, _ := strings.Cut(srv.HTTPAddr, ":")
	hc := &http.Client{}
	t.Cleanup(hc.CloseIdleConnections)
	for _, tc := range []struct {
		host, path string
		want       int
	}{
		{srv.HTTPAddr, "/v1/locks?prefix=a", http.StatusOK},
		{"localhost:" + port, "/v1/locks?prefix=a", http.StatusOK},
		{"LOCALHOST", "/v1/locks?prefix=a", http.StatusOK},
		{"127.0.0.2:" + port, "/v1/locks?prefix=a", http.StatusOK},
		{"[::1]:" + port, "/v1/locks?prefix=a", http.StatusOK},
		{"127.0.0.1:" + port, "/console/", http.StatusOK},
		{"127.0.0.1:" + port, "/v1/nothing", http.StatusNotFound},
		{"evil.example:" + port, "/v1/locks?prefix=a", http.StatusMisdirectedRequest},
		{"evil.example", "/v1/sessions", http.StatusMisdirectedRequest},
		{"localhost.evil.example:" + port, "/v1/locks?prefix=a", http.StatusMisdirectedRequest},
		{"10.0.0.1:" + port, "/v1/locks?prefix=a", http.StatusMisdirectedRequest},
		{"evil.example:" + port, "/console/", http.StatusMisdirectedRequest},
	} {
		req, err := http.NewRequest("GET", "http://"+srv.HTTPAddr+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = tc.host
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("Host %s GET %s: %v", tc.host, tc.path, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != tc.want {
			t.Errorf("Host %s GET %s = %d %s, want %d", tc.host, tc.path, resp.StatusCode, body, tc.want)
			continue
		}
		if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("Host %s GET %s: X-Content-Type-Options %q, want nosniff", tc.host, tc.path, got)
		}
		if tc.want == http.StatusMisdirectedRequest {
			var out obj
			if err := json.Unmarshal(body, &out); err != nil {
				t.Fatalf("refusal %q is not JSON: %v", body, err)
			}
			if code, _ := out["code"].(float64); code != 7 || out["reason"] != "HOST_NOT_LOOPBACK" {
				t.Errorf("Host %s: refusal %v, want code 7 (PERMISSION_DENIED) and reason HOST_NOT_LOOPBACK", tc.host, out)
			}
		}
	}
}
