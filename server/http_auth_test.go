package server_test

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/server"
)

// httpStatusOf is the HTTP status C2 #ct2-http gives a gRPC code.
var httpStatusOf = map[codes.Code]int{
	codes.OK: 200, codes.InvalidArgument: 400, codes.FailedPrecondition: 400, codes.Unauthenticated: 401,
	codes.PermissionDenied: 403, codes.ResourceExhausted: 429, codes.Unavailable: 503, codes.DeadlineExceeded: 504,
}

// TestHTTPAccessParity: with a policy and tokens (the TestPolicyMatrix
// setup), every call of a subset of the matrix gets over HTTP exactly the
// outcome it gets over gRPC — allowed, or denied with the same reason —
// and HTTP denials are counted like gRPC ones. A Grpc-Metadata-
// Authorization header is no credential, and an Authorization header that
// cannot be metadata is refused, not taken as anonymous.
func TestHTTPAccessParity(t *testing.T) {
	az, _ := authFiles(t, matrixPolicy, "root", "reader", "locker", "admin", "nobody")
	srv := startHTTP(t, lockdtest.Backends[0], lockdtest.Options{Auth: az})
	api := dial(t, srv.Addr)
	ctx := testCtx(t, 2*time.Minute)
	root := as(ctx, "root")
	rootSID := openRaw(t, root, api, longTTL).SessionId
	if r, err := api.Acquire(root, &lockdv1.AcquireRequest{SessionId: rootSID, Key: "a/held"}); err != nil || !r.Granted {
		t.Fatalf("root Acquire(a/held) = %v, %v", r, err)
	}
	// locker's session, opened over HTTP (so its secret is the HTTP
	// client's) and bound to locker.
	lc := newJClient(t, "http://"+srv.HTTPAddr, nil)
	lc.token = "token-locker"
	ls := lc.open(longTTL)

	type call struct {
		name string
		grpc func(ctx context.Context) error
		http func(c *jclient) (int, obj)
	}
	sec := func() []byte { return mustB64(t, ls.secret) }
	calls := []call{
		{"OpenSession",
			func(ctx context.Context) error {
				_, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: longTTL.Milliseconds()})
				return err
			},
			func(c *jclient) (int, obj) {
				return c.do("POST", "/v1/sessions", obj{"ttl_ms": longTTL.Milliseconds()})
			}},
		{"Heartbeat",
			func(ctx context.Context) error {
				_, err := api.Heartbeat(ctx, &lockdv1.HeartbeatRequest{SessionId: ls.id, SessionSecret: sec()})
				return err
			},
			func(c *jclient) (int, obj) {
				return c.do("POST", "/v1/sessions/"+ls.id+":keepalive", obj{"session_secret": ls.secret})
			}},
		{"Acquire a/x",
			func(ctx context.Context) error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: ls.id, SessionSecret: sec(), Key: "a/x"})
				return err
			},
			func(c *jclient) (int, obj) {
				return c.do("POST", "/v1/locks/a/x:acquire", obj{"session_id": ls.id, "session_secret": ls.secret})
			}},
		{"Acquire ab/x",
			func(ctx context.Context) error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: ls.id, SessionSecret: sec(), Key: "ab/x"})
				return err
			},
			func(c *jclient) (int, obj) {
				return c.do("POST", "/v1/locks/ab/x:acquire", obj{"session_id": ls.id, "session_secret": ls.secret})
			}},
		{"Inspect a/held",
			func(ctx context.Context) error {
				_, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: "a/held"})
				return err
			},
			func(c *jclient) (int, obj) { return c.do("GET", "/v1/locks/a/held", nil) }},
		{"List a/",
			func(ctx context.Context) error {
				_, err := api.List(ctx, &lockdv1.ListRequest{Prefix: "a/"})
				return err
			},
			func(c *jclient) (int, obj) { return c.do("GET", "/v1/locks?prefix=a/", nil) }},
		{"Revoke a/free",
			func(ctx context.Context) error {
				_, err := api.Revoke(ctx, &lockdv1.RevokeRequest{Key: "a/free"})
				return err
			},
			func(c *jclient) (int, obj) { return c.do("POST", "/v1/locks/a/free:revoke", obj{}) }},
		{"CloseSessions ghost",
			func(ctx context.Context) error {
				_, err := api.CloseSessions(ctx, &lockdv1.CloseSessionsRequest{Principal: "ghost"})
				return err
			},
			func(c *jclient) (int, obj) { return c.do("POST", "/v1/sessions:closeAll", obj{"principal": "ghost"}) }},
	}
	denials := 0
	for _, p := range []string{"reader", "locker", "admin", "nobody", "", "not-a-principal"} {
		hc := newJClient(t, "http://"+srv.HTTPAddr, nil)
		gctx := ctx
		if p != "" {
			hc.token = "token-" + p
			gctx = metadata.AppendToOutgoingContext(ctx, auth.AuthorizationHeader, "Bearer token-"+p)
		}
		for _, c := range calls {
			gerr := c.grpc(gctx)
			gst := status.Convert(gerr)
			st, out := c.http(hc)
			if want := httpStatusOf[gst.Code()]; st != want || (gerr != nil && out["reason"] != reason(gerr)) {
				t.Errorf("%s as %q: gRPC %v (reason %q), HTTP %d %v; want the same outcome", c.name, p, gst.Code(), reason(gerr), st, out)
			}
			if gst.Code() == codes.PermissionDenied || gst.Code() == codes.Unauthenticated {
				denials++
			}
		}
	}
	if denials < 20 {
		t.Fatalf("only %d denials in the matrix subset: the comparison checks too little", denials)
	}
	// The HTTP denials were counted as gRPC's are: twice each in all.
	if got := counter(t, srv.Registry, "lockd_auth_denied_total", map[string]string{"method": "Inspect", "reason": "access_denied"}); got != 2*4 {
		t.Errorf("lockd_auth_denied_total{Inspect, access_denied} = %v; want 8 (locker, admin, nobody, anonymous × gRPC and HTTP)", got)
	}

	// Grpc-Metadata-Authorization is not a credential: anonymous, denied.
	anon := newJClient(t, "http://"+srv.HTTPAddr, nil)
	st, out := anon.do("GET", "/v1/locks/a/held", nil, "Grpc-Metadata-Authorization", "Bearer token-root")
	wantErr(t, "Inspect with Grpc-Metadata-Authorization", st, out, http.StatusForbidden, "ACCESS_DENIED")
	// A header the gateway could not forward is refused, not anonymous.
	st, out = anon.do("GET", "/v1/locks/a/held", nil, "Authorization", "Bearer t\u00f6ken")
	wantErr(t, "Inspect with a non-ASCII Authorization", st, out, http.StatusUnauthorized, "UNAUTHENTICATED")
	// root's token over HTTP is root.
	anon.token = "token-root"
	if in := anon.ok("GET", "/v1/locks/a/held", nil); in["held"] != true {
		t.Errorf("root Inspect over HTTP = %v; want held", in)
	}
	// root closes locker's sessions over HTTP (C2 #ct2-close-sessions):
	// ls and the two the matrix opened as locker (gRPC and HTTP), with
	// ls's lock on a/x; locker's next heartbeat of ls finds it dead.
	if out := anon.ok("POST", "/v1/sessions:closeAll", obj{"principal": "locker"}); out["closed"] != "3" || out["released"] != "1" {
		t.Errorf("root POST /v1/sessions:closeAll {locker} = %v; want closed \"3\", released \"1\"", out)
	}
	if out := lc.ok("POST", "/v1/sessions/"+ls.id+":keepalive", obj{"session_secret": ls.secret}); out["live"] != false {
		t.Errorf("locker's heartbeat after root closed its sessions = %v; want live false", out)
	}
}

func mustB64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatalf("session_secret %q is not base64: %v", s, err)
	}
	return b
}

// TestHTTPSIdentity: over HTTPS (the gRPC listener's files, a CA of
// testkit.NewCA) the client certificate of the HTTP connection is the
// principal, as over gRPC: alice's certificate may lock jobs/, bob's is
// denied (logged as by bob), a client without a certificate is anonymous
// (client-auth request) and denied, alice's session refuses bob even with
// its secret, and a certificate and a token naming different principals
// are refused. A plaintext request to the HTTPS port fails.
func TestHTTPSIdentity(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA := testkit.NewCA(t, "server-ca"), testkit.NewCA(t, "client-ca")
	cfg := lockdtest.Config()
	cfg.TLSCertFile, cfg.TLSKeyFile = serverCA.Issue(t, testkit.CertOptions{}).Write(t, dir, "server")
	cfg.TLSClientCAFile = clientCA.WriteCA(t, dir, "client-ca.pem")
	cfg.TLSClientAuth = server.ClientAuthRequest
	az, _ := authFiles(t, `
rules:
  - name: jobs
    principals: [alice, bob]
    prefixes: ["jobs/"]
    allow: [read]
  - name: alice-locks
    principals: [alice]
    prefixes: ["jobs/"]
    allow: [lock]
  - name: bob-sessions
    principals: [bob]
    prefixes: ["bob/"]
    allow: [lock]
`, "alice", "bob")
	log, logs := testkit.NewLogger()
	srv := startHTTP(t, backend.Etcd, lockdtest.Options{Config: &cfg, Auth: az, Logger: log})
	base := "https://" + srv.HTTPAddr
	withCert := func(name string) *jclient {
		tc := &tls.Config{RootCAs: serverCA.Pool(), MinVersion: tls.VersionTLS12}
		if name != "" {
			c := clientCA.Issue(t, testkit.CertOptions{CommonName: name}).TLS(t)
			tc.Certificates = []tls.Certificate{c}
		}
		return newJClient(t, base, tc)
	}
	alice, bob, nobody := withCert("alice"), withCert("bob"), withCert("")

	s := alice.open(longTTL)
	g := alice.ok("POST", "/v1/locks/jobs/nightly:acquire", obj{"session_id": s.id, "session_secret": s.secret})
	if g["granted"] != true {
		t.Fatalf("alice acquire = %v; want granted", g)
	}
	if in := bob.ok("GET", "/v1/locks/jobs/nightly", nil); in["held"] != true {
		t.Errorf("bob inspect = %v; want held (bob may read jobs/)", in)
	}
	st, out := bob.do("POST", "/v1/locks/jobs/other:acquire", obj{"session_id": s.id, "session_secret": s.secret})
	wantErr(t, "bob acquire jobs/other", st, out, http.StatusForbidden, "ACCESS_DENIED")
	testkit.Eventually(t, 5*time.Second, "auth_denied by bob", func() bool {
		for _, ev := range logs.Events("auth_denied") {
			if ev["by"] == "bob" && ev["method"] == "Acquire" && ev["key"] == "jobs/other" {
				return true
			}
		}
		return false
	})
	st, out = nobody.do("GET", "/v1/locks/jobs/nightly", nil)
	wantErr(t, "inspect without a certificate", st, out, http.StatusForbidden, "ACCESS_DENIED")
	// bob may hold sessions, but not alice's, even with its secret.
	st, out = bob.do("POST", "/v1/sessions/"+s.id+":keepalive", obj{"session_secret": s.secret})
	wantErr(t, "bob keepalive of alice's session", st, out, http.StatusForbidden, "SESSION_PRINCIPAL_MISMATCH")
	bob.token = "token-alice"
	st, out = bob.do("GET", "/v1/locks/jobs/nightly", nil)
	wantErr(t, "bob's certificate with alice's token", st, out, http.StatusUnauthorized, "UNAUTHENTICATED")
	alice.ok("POST", "/v1/sessions/"+s.id+":close", obj{"session_secret": s.secret})

	// Plaintext to the HTTPS port: no answer of the API.
	plain := newJClient(t, "http://"+srv.HTTPAddr, nil)
	if st, body := plain.doRaw("GET", "/v1/locks/jobs/nightly", nil); st != http.StatusBadRequest || !strings.Contains(string(body), "HTTPS") {
		t.Errorf("plaintext request to the HTTPS port = %d %q; want 400 from the TLS server", st, body)
	}
}

// TestHTTPConnectionLimit: HTTP connections count against
// lock.server.max-connections with gRPC's (C5 #ct5-http): with one gRPC
// connection open and a limit of one, an HTTP request is refused with
// 429 LIMIT; once the gRPC connection is gone, a new HTTP connection is
// served.
func TestHTTPConnectionLimit(t *testing.T) {
	cfg := lockdtest.Config()
	cfg.MaxConnections = 1
	srv := startHTTP(t, lockdtest.Backends[0], lockdtest.Options{Config: &cfg})
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, time.Minute)
	if _, err := lockdv1.NewLockServiceClient(conn).List(ctx, &lockdv1.ListRequest{}); err != nil {
		t.Fatalf("List over the one gRPC connection: %v", err)
	}
	c := newJClient(t, "http://"+srv.HTTPAddr, nil)
	st, out := c.do("GET", "/v1/locks", nil)
	wantErr(t, "List over HTTP beyond max-connections", st, out, http.StatusTooManyRequests, "LIMIT")
	if md, _ := out["details"].([]any)[0].(obj)["metadata"].(obj); md["limit"] != "connections" {
		t.Errorf("limit metadata = %v; want connections", out["details"])
	}
	_ = conn.Close()
	c.hc.Transport.(*http.Transport).CloseIdleConnections()
	testkit.Eventually(t, 10*time.Second, "an HTTP connection served once the gRPC one closed", func() bool {
		c := newJClient(t, "http://"+srv.HTTPAddr, nil)
		st, _ := c.doRaw("GET", "/v1/locks", nil)
		c.hc.Transport.(*http.Transport).CloseIdleConnections()
		return st == http.StatusOK
	})
}
