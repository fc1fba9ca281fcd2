package server_test

import (
	"net/http"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/lockdtest"
)

// TestHTTPCrossOrigin: a write (POST) that a browser marks as cross-origin
// is refused with 403 PERMISSION_DENIED before it reaches the service (C5
// #ct5-http), so a page of another origin cannot make a browser take,
// release or revoke locks; the same request from the same origin, or from a
// client that is not a browser (no Sec-Fetch-Site, no Origin), works, and
// so do cross-origin reads (which the page cannot read without CORS).
func TestHTTPCrossOrigin(t *testing.T) {
	srv := startHTTP(t, lockdtest.Backends[0], lockdtest.Options{})
	c := newJClient(t, "http://"+srv.HTTPAddr, nil)
	self := "http://" + srv.HTTPAddr
	open := map[string]any{"ttl_ms": (10 * time.Second).Milliseconds()}
	for _, tc := range []struct {
		name    string
		method  string
		path    string
		body    any
		headers []string
		want    int
	}{
		{"no browser headers", "POST", "/v1/sessions", open, nil, http.StatusOK},
		{"same-origin fetch", "POST", "/v1/sessions", open, []string{"Sec-Fetch-Site", "same-origin", "Origin", self}, http.StatusOK},
		{"typed into the address bar", "POST", "/v1/sessions", open, []string{"Sec-Fetch-Site", "none"}, http.StatusOK},
		{"same Origin without Sec-Fetch-Site", "POST", "/v1/sessions", open, []string{"Origin", self}, http.StatusOK},
		{"cross-site", "POST", "/v1/sessions", open, []string{"Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"}, http.StatusForbidden},
		{"same-site other origin", "POST", "/v1/locks/a:revoke", map[string]any{}, []string{"Sec-Fetch-Site", "same-site"}, http.StatusForbidden},
		{"other Origin without Sec-Fetch-Site", "POST", "/v1/locks/a:revoke", map[string]any{}, []string{"Origin", "http://evil.example"}, http.StatusForbidden},
		{"cross-site read", "GET", "/v1/locks?prefix=a", nil, []string{"Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"}, http.StatusOK},
	} {
		st, body := c.do(tc.method, tc.path, tc.body, tc.headers...)
		if st != tc.want {
			t.Errorf("%s: %s %s = %d %v, want %d", tc.name, tc.method, tc.path, st, body, tc.want)
			continue
		}
		if st == http.StatusForbidden {
			if code, _ := body["code"].(float64); code != 7 || body["reason"] != "CROSS_ORIGIN" {
				t.Errorf("%s: refusal %v, want code 7 (PERMISSION_DENIED) and reason CROSS_ORIGIN", tc.name, body)
			}
		}
	}
}
