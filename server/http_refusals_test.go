package server_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/server"
)

// TestHTTPRefusalsHaveReasons walks every refusal the HTTP listener writes
// itself, before or around the gateway (C2 #ct2-http-refusals): each is the
// JSON error shape with a lockd reason (HOST_NOT_LOOPBACK, CROSS_ORIGIN,
// NO_ROUTE, METHOD_NOT_ALLOWED; INVALID_ARGUMENT naming the field path;
// SHUTTING_DOWN, INTERNAL), the console's included, and every reason of
// wireerr.HTTPReasons is met. The control: a well-formed request on the
// same listener answers 200. On the code before #ct2-http-refusals every
// one of these answered with an empty reason.
func TestHTTPRefusalsHaveReasons(t *testing.T) {
	cfg := lockdtest.Config()
	cfg.HTTPConsole = true
	srv := startHTTP(t, lockdtest.Backends[0], lockdtest.Options{Config: &cfg})
	seen := map[string]bool{}

	// check verifies one answer: status, reason (also in the ErrorInfo) and,
	// for INVALID_ARGUMENT, the field of the BadRequest.
	check := func(what string, st int, raw []byte, wantStatus int, wantReason, wantField string) {
		t.Helper()
		var out obj
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Errorf("%s: answer %d %q is not JSON: %v", what, st, raw, err)
			return
		}
		wantErr(t, what, st, out, wantStatus, wantReason)
		if code, _ := out["code"].(float64); codes.Code(code) != wireerr.Code(wantReason) {
			t.Errorf("%s: code %v, want %v (the reason's)", what, out["code"], wireerr.Code(wantReason))
		}
		if msg, _ := out["message"].(string); msg == "" {
			t.Errorf("%s: no message in %v", what, out)
		}
		if wantField != "" {
			if f := fieldOf(out); f != wantField {
				t.Errorf("%s: field %q in %v, want %q", what, f, out, wantField)
			}
		}
		seen[wantReason] = true
	}
	req := func(what, method, path, body string, wantStatus int, wantReason, wantField string, headers ...string) {
		t.Helper()
		st, raw := rawRequest(t, srv.HTTPAddr, method, path, body, headers...)
		check(what, st, raw, wantStatus, wantReason, wantField)
	}

	// The control.
	if st, raw := rawRequest(t, srv.HTTPAddr, "GET", "/v1/locks?prefix=jobs/", ""); st != http.StatusOK {
		t.Fatalf("control: GET /v1/locks = %d %s, want 200", st, raw)
	}

	req("a Host that is not loopback", "GET", "/v1/locks?prefix=a", "", http.StatusMisdirectedRequest, wireerr.ReasonHostNotLoopback, "", "Host", "evil.example")
	req("the console under a Host that is not loopback", "GET", "/console/", "", http.StatusMisdirectedRequest, wireerr.ReasonHostNotLoopback, "", "Host", "evil.example")
	req("a cross-site POST", "POST", "/v1/locks/a:revoke", "{}", http.StatusForbidden, wireerr.ReasonCrossOrigin, "", "Sec-Fetch-Site", "cross-site")
	req("an unknown path", "GET", "/v2/nothing", "", http.StatusNotFound, wireerr.ReasonNoRoute, "")
	req("a path with another method", "DELETE", "/v1/sessions", "", http.StatusMethodNotAllowed, wireerr.ReasonMethodNotAllowed, "")
	req("a request target that is not a path", "GET", "*", "", http.StatusBadRequest, wireerr.ReasonInvalidArgument, "path")
	req("a body that is not JSON", "POST", "/v1/sessions", "not json", http.StatusBadRequest, wireerr.ReasonInvalidArgument, "request")
	req("an unknown body field", "POST", "/v1/sessions", `{"nope":1}`, http.StatusBadRequest, wireerr.ReasonInvalidArgument, "nope")
	req("a body field of the wrong type", "POST", "/v1/sessions", `{"ttl_ms":"abc"}`, http.StatusBadRequest, wireerr.ReasonInvalidArgument, "ttl_ms")
	req("a trailing value after the body", "POST", "/v1/locks/a:revoke", `{} {}`, http.StatusBadRequest, wireerr.ReasonInvalidArgument, "request")
	req("a query parameter that does not parse", "GET", "/v1/locks?prefix=a&limit=abc", "", http.StatusBadRequest, wireerr.ReasonInvalidArgument, "limit")
	req("the console with another method", "POST", "/console/", "", http.StatusMethodNotAllowed, wireerr.ReasonMethodNotAllowed, "")
	req("an unknown console file", "GET", "/console/nope.js", "", http.StatusNotFound, wireerr.ReasonNoRoute, "")
	// The console answers no range and no precondition (ServeContent's 416
	// and 412 are plain text): the whole file.
	for _, h := range [][]string{{"Range", "bytes=999999-"}, {"If-Match", `"nope"`}, {"If-Unmodified-Since", "Mon, 02 Jan 2006 15:04:05 GMT"}} {
		if st, raw := rawRequest(t, srv.HTTPAddr, "GET", "/console/console.css", "", h...); st != http.StatusOK || len(raw) == 0 {
			t.Errorf("GET /console/console.css with %s: %d (%d bytes), want 200 and the file", h[0], st, len(raw))
		}
	}

	// The in-process hop's own refusals: a connection that is closing
	// (shutdown), a request on no HTTP connection; and a transport error
	// of the hop without a reason.
	closing, outside := server.HTTPHopErrors()
	st, raw := server.HTTPErrorAnswer(closing)
	check("a request on a closing HTTP connection", st, raw, http.StatusServiceUnavailable, wireerr.ReasonShuttingDown, "")
	st, raw = server.HTTPErrorAnswer(outside)
	check("a request on no HTTP connection", st, raw, http.StatusInternalServerError, wireerr.ReasonInternal, "")
	st, raw = server.HTTPErrorAnswer(status.Error(codes.Internal, "grpc: error while marshaling"))
	check("a transport error of the hop", st, raw, http.StatusInternalServerError, wireerr.ReasonInternal, "")
	st, raw = server.HTTPErrorAnswer(errors.New("plain"))
	check("an error that is not a status", st, raw, http.StatusInternalServerError, wireerr.ReasonInternal, "")
	st, raw = server.HTTPErrorAnswer(status.Error(codes.Unavailable, "transport is closing"))
	check("the hop's transport closing", st, raw, http.StatusServiceUnavailable, wireerr.ReasonUnavailable, "")

	for _, r := range wireerr.HTTPReasons() {
		if !seen[r] {
			t.Errorf("no refusal with the HTTP reason %s was walked", r)
		}
	}
}

// rawRequest sends one request over a new TCP connection, written by hand
// so the request target and Host are exactly as given (Host defaults to
// addr), and returns the status and body.
func rawRequest(t *testing.T, addr, method, target, body string, headers ...string) (int, []byte) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	host := addr
	var b strings.Builder
	for i := 0; i+1 < len(headers); i += 2 {
		if http.CanonicalHeaderKey(headers[i]) == "Host" {
			host = headers[i+1]
			continue
		}
		b.WriteString(headers[i] + ": " + headers[i+1] + "\r\n")
	}
	_, err = io.WriteString(conn, method+" "+target+" HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n"+
		"Content-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n"+b.String()+"\r\n"+body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, target, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, target, err)
	}
	return resp.StatusCode, raw
}

// fieldOf is the field of the first BadRequest field violation in an
// error answer.
func fieldOf(out obj) string {
	details, _ := out["details"].([]any)
	for _, d := range details {
		m, _ := d.(obj)
		vs, _ := m["field_violations"].([]any)
		if len(vs) == 0 {
			vs, _ = m["fieldViolations"].([]any)
		}
		for _, v := range vs {
			if f, _ := v.(obj)["field"].(string); f != "" {
				return f
			}
		}
	}
	return ""
}
