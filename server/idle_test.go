package server_test

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// idlePolicy: alice may lock and read everything; mallory has a token but
// no rule.
const idlePolicy = `
rules:
  - principals: [alice]
    prefixes: ["*"]
    allow: [read, lock]
`

// TestUnauthorisedConnectionClosed: a connection that makes no authorised
// call within lock.server.conn-auth-timeout is closed (C5 #ct5-idle, issue
// 23 F1), so it cannot hold a slot of max-connections: with one slot held
// by mallory (no rule: every call refused), alice is refused LIMIT
// connections, and served once mallory's connection is closed. Over HTTP
// the same: mallory's keep-alive connection is closed after a refused
// request. Both are counted in lockd_connections_closed_total.
func TestUnauthorisedConnectionClosed(t *testing.T) {
	az, _ := authFiles(t, idlePolicy, "alice", "mallory")
	cfg := lockdtest.Config()
	cfg.MaxConnections = 1
	cfg.ConnAuthTimeout = time.Second
	cfg.HTTPListen = "127.0.0.1:0"
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{Config: &cfg, NoClient: true, Auth: az})
	ctx := testCtx(t, time.Minute)
	// Generous against load: the guard closes at the bound, the test waits
	// far longer for the effect.
	bound := 20 * cfg.ConnAuthTimeout

	dial := func() (*grpc.ClientConn, lockdv1.LockServiceClient) {
		conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn, lockdv1.NewLockServiceClient(conn)
	}
	mconn, mallory := dial()
	if _, err := mallory.Inspect(as(ctx, "mallory"), &lockdv1.InspectRequest{Key: "k"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("mallory's Inspect = %v; want PermissionDenied", err)
	}
	aconn, alice := dial()
	_, err := alice.Inspect(as(ctx, "alice"), &lockdv1.InspectRequest{Key: "k"})
	if wireerr.Limit(status.Convert(err)) != wireerr.LimitConnections {
		t.Fatalf("alice's Inspect while mallory holds the one slot = %v; want LIMIT connections", err)
	}
	_ = aconn.Close()
	testkit.Eventually(t, bound, "alice served once mallory's unauthorised connection is closed", func() bool {
		conn, alice := dial()
		defer conn.Close()
		_, err := alice.Inspect(as(ctx, "alice"), &lockdv1.InspectRequest{Key: "k"})
		return err == nil
	})
	if st := mconn.GetState().String(); st == "READY" {
		t.Errorf("mallory's connection is %s; want closed by the server", st)
	}

	// HTTP: a refused request, then the server closes the connection.
	c, err := net.Dial("tcp", srv.HTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("GET /v1/locks/k HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer token-mallory\r\n\r\n"))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("mallory's HTTP request: %v", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("mallory's HTTP request = %d; want 403", resp.StatusCode)
	}
	_ = c.SetReadDeadline(time.Now().Add(bound))
	if n, err := br.ReadByte(); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("mallory's HTTP connection after a refused request: read %v, %v; want closed by the server", n, err)
	}
	for _, l := range []string{"grpc", "http"} {
		if n := counter(t, srv.Registry, "lockd_connections_closed_total", map[string]string{"listener": l, "reason": "unauthorised"}); n < 1 {
			t.Errorf("lockd_connections_closed_total{listener=%s,reason=unauthorised} = %v; want ≥ 1", l, n)
		}
	}
}
