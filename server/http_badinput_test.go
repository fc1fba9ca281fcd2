package server_test

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// TestHTTPBadInput: over HTTP, a key that is not valid UTF-8 is 400
// INVALID_ARGUMENT naming the field (it was 500 "error while marshaling"),
// a value over the request bound is 413 INVALID_ARGUMENT naming the request
// (it was 429 without a reason), and an encoded "/" is decoded (C2
// #ct2-bad-input, #ct2-http).
func TestHTTPBadInput(t *testing.T) {
	srv := startHTTP(t, backend.Etcd, lockdtest.Options{})
	c := newJClient(t, "http://"+srv.HTTPAddr, nil)

	field := fieldOf // http_refusals_test.go

	st, out := c.do("GET", "/v1/locks/jobs/%FF%FE", nil)
	wantErr(t, "GET /v1/locks/jobs/%FF%FE", st, out, http.StatusBadRequest, wireerr.ReasonInvalidArgument)
	if f := field(out); f != "key" {
		t.Errorf("GET /v1/locks/jobs/%%FF%%FE: field %q in %v; want key", f, out)
	}
	st, out = c.do("GET", "/v1/locks?prefix=jobs%2F%FF", nil)
	wantErr(t, "GET /v1/locks?prefix=jobs%2F%FF", st, out, http.StatusBadRequest, wireerr.ReasonInvalidArgument)
	if f := field(out); f != "prefix" {
		t.Errorf("List with an invalid UTF-8 prefix: field %q in %v; want prefix", f, out)
	}

	s := c.open(longTTL)
	big := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("v", 150<<10)))
	st, out = c.do("POST", "/v1/locks/jobs/big:acquire", obj{"session_id": s.id, "session_secret": s.secret, "value": big})
	wantErr(t, "Acquire with a 150 KiB value", st, out, http.StatusRequestEntityTooLarge, wireerr.ReasonInvalidArgument)
	if f := field(out); f != "request" {
		t.Errorf("Acquire with a 150 KiB value: field %q in %v; want request", f, out)
	}
	// A body over the HTTP bound is 413 as well.
	huge := strings.Repeat("v", 300<<10)
	st, out = c.do("POST", "/v1/locks/jobs/big:acquire", obj{"session_id": s.id, "session_secret": s.secret, "value": huge})
	if st != http.StatusRequestEntityTooLarge {
		t.Errorf("Acquire with a 300 KiB body = %d %v; want 413", st, out)
	}

	// An encoded "/" is decoded: the key is jobs/a/b.
	c.ok("POST", "/v1/locks/jobs/a%2Fb:acquire", obj{"session_id": s.id, "session_secret": s.secret})
	out = c.ok("GET", "/v1/locks/jobs/a/b", nil)
	if lock, _ := out["lock"].(obj); out["held"] != true || lock["key"] != "jobs/a/b" {
		t.Errorf("GET /v1/locks/jobs/a/b after acquiring jobs/a%%2Fb = %v; want held, key jobs/a/b", out)
	}
}
