package server_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// The HTTP/JSON API tests (C2 #ct2-http, C5 #ct5-http). The client side is
// plain net/http and encoding/json: nothing of lockd is used to make or
// read the requests (what any language has).

// obj is a decoded JSON object.
type obj = map[string]any

// jclient is an HTTP/JSON client of one server.
type jclient struct {
	t     *testing.T
	base  string // http://host:port or https://host:port
	hc    *http.Client
	token string // sent as Authorization: Bearer
}

func newJClient(t *testing.T, base string, tc *tls.Config) *jclient {
	tr := &http.Transport{TLSClientConfig: tc}
	t.Cleanup(tr.CloseIdleConnections)
	return &jclient{t: t, base: base, hc: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
}

// do sends method path with body (JSON-encoded unless nil) and returns the
// status and the decoded answer; headers are extra request headers.
func (c *jclient) do(method, path string, body any, headers ...string) (int, obj) {
	c.t.Helper()
	st, raw := c.doRaw(method, path, body, headers...)
	var out obj
	if err := json.Unmarshal(raw, &out); err != nil {
		c.t.Fatalf("%s %s: status %d, body %q is not a JSON object: %v", method, path, st, raw, err)
	}
	return st, out
}

func (c *jclient) doRaw(method, path string, body any, headers ...string) (int, []byte) {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	return resp.StatusCode, raw
}

// ok is do that must answer 200.
func (c *jclient) ok(method, path string, body any) obj {
	c.t.Helper()
	st, out := c.do(method, path, body)
	if st != http.StatusOK {
		c.t.Fatalf("%s %s = %d %v; want 200", method, path, st, out)
	}
	return out
}

// wantErr checks an error answer: HTTP status, gRPC code and lockd reason,
// with the reason also in the ErrorInfo detail.
func wantErr(t *testing.T, what string, st int, out obj, wantStatus int, wantReason string) {
	t.Helper()
	if st != wantStatus || out["reason"] != wantReason {
		t.Errorf("%s = %d %v; want %d with reason %s", what, st, out, wantStatus, wantReason)
		return
	}
	if wantReason == "" {
		return
	}
	details, _ := out["details"].([]any)
	for _, d := range details {
		if m, _ := d.(obj); m["@type"] == "type.googleapis.com/google.rpc.ErrorInfo" && m["reason"] == wantReason && m["domain"] == "lockd.lock.dev" {
			return
		}
	}
	t.Errorf("%s: no google.rpc.ErrorInfo {domain lockd.lock.dev, reason %s} in details %v", what, wantReason, out["details"])
}

// num reads a JSON number or a proto3-JSON 64-bit integer (a string).
func num(t *testing.T, v any) int64 {
	t.Helper()
	switch x := v.(type) {
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			t.Fatalf("%q is not an integer", x)
		}
		return n
	case float64:
		return int64(x)
	}
	t.Fatalf("%v (%T) is not an integer", v, v)
	return 0
}

func str(v any) string { s, _ := v.(string); return s }

// session is an open session as an HTTP client keeps it.
type jsession struct {
	id, secret string
	margin     time.Duration
	deadline   time.Time // send time of the last trust-extending call + remaining − margin
}

// open opens a session, counting its deadline from the send time.
func (c *jclient) open(ttl time.Duration) *jsession {
	c.t.Helper()
	sent := time.Now() // the client's own clock, before sending (C2 #ct2-http)
	out := c.ok("POST", "/v1/sessions", obj{"ttl_ms": ttl.Milliseconds(), "owner": "http-test"})
	s := &jsession{id: str(out["session_id"]), secret: str(out["session_secret"]),
		margin: time.Duration(num(c.t, out["safety_margin_ms"])) * time.Millisecond}
	if s.id == "" || s.secret == "" || num(c.t, out["remaining_ms"]) <= 0 || num(c.t, out["heartbeat_interval_ms"]) <= 0 {
		c.t.Fatalf("open = %v; want a session id, a secret, remaining_ms and heartbeat_interval_ms", out)
	}
	s.extend(c.t, sent, out)
	return s
}

// extend applies the trust rule to an answer of a call sent at sent.
func (s *jsession) extend(t *testing.T, sent time.Time, out obj) {
	t.Helper()
	d := sent.Add(time.Duration(num(t, out["remaining_ms"]))*time.Millisecond - s.margin)
	if d.After(s.deadline) {
		s.deadline = d
	}
}

// startHTTP starts a server with the HTTP/JSON API on backend.
func startHTTP(t *testing.T, backend string, opts lockdtest.Options) *lockdtest.Server {
	t.Helper()
	cfg := lockdtest.Config()
	if opts.Config != nil {
		cfg = *opts.Config
	}
	cfg.HTTPListen = "127.0.0.1:0"
	opts.Config = &cfg
	opts.NoClient = true
	srv := lockdtest.StartBackend(t, backend, opts)
	if srv.HTTPAddr == "" {
		t.Fatal("lockdtest started no HTTP listener")
	}
	return srv
}

// watchLines opens GET /v1/watch?prefix= and returns its lines as they
// come; it returns once the response headers arrived (the watch is
// established).
func watchLines(t *testing.T, c *jclient, prefix string) <-chan obj {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", c.base+"/v1/watch?prefix="+prefix, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	hc := &http.Client{Transport: c.hc.Transport} // no overall timeout: a stream
	resp, err := hc.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("GET /v1/watch: %v", err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		cancel()
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("GET /v1/watch = %d %s %s; want 200 application/x-ndjson", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	lines := make(chan obj, 100)
	done := make(chan struct{})
	go func() { // exits when the stream ends (cancel at cleanup)
		defer close(done)
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var o obj
			if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
				o = obj{"bad line": sc.Text()}
			}
			lines <- o
		}
	}()
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-done })
	return lines
}

// nextEvent returns the next watch line's result, failing after a while.
func nextEvent(t *testing.T, lines <-chan obj) obj {
	t.Helper()
	select {
	case o, ok := <-lines:
		if !ok {
			t.Fatal("the watch stream ended")
		}
		r, isResult := o["result"].(obj)
		if !isResult {
			t.Fatalf("watch line %v; want {\"result\": …}", o)
		}
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no watch event within 30s")
	}
	return nil
}

// TestHTTPLifeCycle drives the whole life cycle of a lock through the
// HTTP/JSON API with net/http (C2 #ct2-http): open, heartbeat (remaining_ms,
// the deadline counted from the send time), acquire, inspect shows the
// token, list, a blocked acquire granted on release, a try that times out,
// release, close, a dead session, and a watch stream that sees it all;
// errors carry the HTTP status and the lockd reason.
func TestHTTPLifeCycle(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := startHTTP(t, backend, lockdtest.Options{})
		c := newJClient(t, "http://"+srv.HTTPAddr, nil)
		events := watchLines(t, c, "http/")

		s := c.open(time.Minute)
		sent := time.Now()
		hb := c.ok("POST", "/v1/sessions/"+s.id+":keepalive", obj{"session_secret": s.secret})
		if hb["live"] != true || num(t, hb["remaining_ms"]) <= 0 {
			t.Fatalf("keepalive = %v; want live with remaining_ms", hb)
		}
		s.extend(t, sent, hb)
		if !s.deadline.After(time.Now()) || s.deadline.After(sent.Add(time.Minute)) {
			t.Errorf("deadline %v from now; want in (now, send + ttl]", time.Until(s.deadline))
		}

		// A key with a '/' and a ':' in its last segment.
		key := "http/job:1"
		g := c.ok("POST", "/v1/locks/"+key+":acquire", obj{"session_id": s.id, "session_secret": s.secret})
		token := num(t, g["token"])
		if g["granted"] != true || g["key"] != key || token <= 0 || num(t, g["remaining_ms"]) <= 0 {
			t.Fatalf("acquire = %v; want granted %s with a token", g, key)
		}
		if ev := nextEvent(t, events); ev["kind"] != "EVENT_KIND_ACQUIRED" || ev["key"] != key || num(t, ev["token"]) != token || ev["session_id"] != s.id {
			t.Errorf("watch event %v; want ACQUIRED %s token %d", ev, key, token)
		}
		in := c.ok("GET", "/v1/locks/"+key, nil)
		lock, _ := in["lock"].(obj)
		if in["held"] != true || num(t, lock["token"]) != token || lock["session_id"] != s.id || lock["owner"] != "http-test" {
			t.Errorf("inspect = %v; want held with token %d by %s", in, token, s.id)
		}
		ls := c.ok("GET", "/v1/locks?prefix=http/", nil)
		if locks, _ := ls["locks"].([]any); len(locks) != 1 || str(locks[0].(obj)["key"]) != key {
			t.Errorf("list = %v; want %s", ls, key)
		}
		hb = c.ok("POST", "/v1/sessions/"+s.id+":keepalive", obj{"session_secret": s.secret})
		if held, _ := hb["held"].(obj)["locks"].([]any); len(held) != 1 || num(t, held[0].(obj)["token"]) != token {
			t.Errorf("keepalive while holding = %v; want the lock in held", hb)
		}

		// Errors: status + reason.
		st, out := c.do("POST", "/v1/locks/"+key+":acquire", obj{"session_id": s.id, "session_secret": "AAAA"})
		wantErr(t, "acquire with a wrong secret", st, out, http.StatusForbidden, "SESSION_SECRET_MISMATCH")
		st, out = c.do("POST", "/v1/sessions", obj{"ttl_ms": 1})
		wantErr(t, "open with ttl_ms 1", st, out, http.StatusBadRequest, "INVALID_ARGUMENT")
		st, out = c.do("POST", "/v1/sessions", obj{"ttl": 1})
		if st != http.StatusBadRequest || num(t, out["code"]) != 3 {
			t.Errorf("open with an unknown field = %d %v; want 400 code 3", st, out)
		}
		st, out = c.do("GET", "/v1/nothing", nil)
		if st != http.StatusNotFound {
			t.Errorf("GET /v1/nothing = %d %v; want 404", st, out)
		}
		st, out = c.do("DELETE", "/v1/sessions", nil)
		if st != http.StatusMethodNotAllowed {
			t.Errorf("DELETE /v1/sessions = %d %v; want 405", st, out)
		}

		// A second session: a timed wait runs out (504 WAIT_TIMEOUT); a
		// blocking one is granted when the holder releases.
		s2 := c.open(time.Minute)
		st, out = c.do("POST", "/v1/locks/"+key+":acquire", obj{"session_id": s2.id, "session_secret": s2.secret, "wait": true, "wait_timeout_ms": 200})
		wantErr(t, "acquire with a wait that runs out", st, out, http.StatusGatewayTimeout, "WAIT_TIMEOUT")
		st, out = c.do("POST", "/v1/locks/"+key+":acquire", obj{"session_id": s2.id, "session_secret": s2.secret})
		if st != http.StatusOK || out["granted"] != false {
			t.Errorf("try of a held key = %d %v; want 200 granted false", st, out)
		}
		waited := make(chan obj, 1)
		c2 := newJClient(t, c.base, nil)
		go func() { // exits when the acquire answers (bounded by its wait)
			_, o := c2.do("POST", "/v1/locks/"+key+":acquire", obj{"session_id": s2.id, "session_secret": s2.secret, "wait": true, "wait_timeout_ms": 60000})
			waited <- o
		}()
		testkit.Eventually(t, 30*time.Second, "the waiter in inspect's waiters", func() bool {
			w, _ := c.ok("GET", "/v1/locks/"+key, nil)["lock"].(obj)["waiters"].([]any)
			return len(w) == 1 && w[0] == s2.id
		})
		c.ok("POST", "/v1/locks/"+key+":release", obj{"session_id": s.id, "session_secret": s.secret, "token": strconv.FormatInt(token, 10)})
		g2 := <-waited
		token2 := num(t, g2["token"])
		if g2["granted"] != true || token2 <= token {
			t.Errorf("blocked acquire = %v; want granted with a token above %d", g2, token)
		}
		if ev := nextEvent(t, events); ev["kind"] != "EVENT_KIND_RELEASED" || num(t, ev["token"]) != token {
			t.Errorf("watch event %v; want RELEASED token %d", ev, token)
		}
		if ev := nextEvent(t, events); ev["kind"] != "EVENT_KIND_ACQUIRED" || num(t, ev["token"]) != token2 || ev["session_id"] != s2.id {
			t.Errorf("watch event %v; want ACQUIRED token %d by %s", ev, token2, s2.id)
		}
		st, out = c.do("POST", "/v1/locks/"+key+":release", obj{"session_id": s.id, "session_secret": s.secret, "token": token})
		wantErr(t, "a second release", st, out, http.StatusForbidden, "NOT_OWNER")

		// Close: the lock goes with the session; the session is dead.
		cl := c.ok("POST", "/v1/sessions/"+s2.id+":close", obj{"session_secret": s2.secret})
		if num(t, cl["released"]) != 1 {
			t.Errorf("close = %v; want released 1", cl)
		}
		if ev := nextEvent(t, events); ev["kind"] != "EVENT_KIND_EXPIRED" || num(t, ev["token"]) != token2 {
			t.Errorf("watch event %v; want EXPIRED token %d", ev, token2)
		}
		hb = c.ok("POST", "/v1/sessions/"+s2.id+":keepalive", obj{"session_secret": s2.secret})
		if hb["live"] != false || num(t, hb["remaining_ms"]) != 0 {
			t.Errorf("keepalive of a closed session = %v; want live false", hb)
		}
		if in := c.ok("GET", "/v1/locks/"+key, nil); in["held"] != false {
			t.Errorf("inspect after close = %v; want not held", in)
		}
		c.ok("POST", "/v1/sessions/"+s.id+":close", obj{"session_secret": s.secret})
	})
}

// TestHTTPWatchError: a watch over an invalid prefix is an ordinary error
// answer; a watch ended by the server's shutdown ends with an error line.
func TestHTTPWatchError(t *testing.T) {
	srv := startHTTP(t, lockdtest.Backends[0], lockdtest.Options{})
	c := newJClient(t, "http://"+srv.HTTPAddr, nil)
	st, out := c.do("GET", "/v1/watch?prefix=%00", nil)
	e, _ := out["error"].(obj)
	if st != http.StatusBadRequest || num(t, e["code"]) != 3 || !strings.Contains(fmt.Sprint(e["details"]), "reason:INVALID_ARGUMENT") {
		t.Errorf("watch of an invalid prefix = %d %v; want 400 {\"error\": INVALID_ARGUMENT}", st, out)
	}
	lines := watchLines(t, c, "w/")
	if err := srv.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	var last obj
	for o := range lines {
		last = o
	}
	e, _ = last["error"].(obj)
	if num(t, e["code"]) != 14 || !strings.Contains(fmt.Sprint(e["details"]), "SHUTTING_DOWN") {
		t.Errorf("last watch line at shutdown = %v; want {\"error\": UNAVAILABLE SHUTTING_DOWN}", last)
	}
}
