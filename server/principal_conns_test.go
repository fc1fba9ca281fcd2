package server_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

const sharesPolicy = `
rules:
  - name: workers
    principals: [alice, bob]
    prefixes: ["*"]
    allow: [read, lock]
`

// TestPrincipalConnections: under a policy a connection counts for the
// principal of its first identified call (tokens here; certificates count
// at the handshake, test/abuse F1); alice's connection beyond her share is
// refused LIMIT principal_connections on every call, counted and logged,
// and gives back its slot of max-connections, so bob still connects while
// the server holds more connections than max-connections would admit.
func TestPrincipalConnections(t *testing.T) {
	cfg := lockdtest.Config()
	cfg.MaxConnections, cfg.PrincipalMaxConnections = 3, 2
	log, logs := testkit.NewLogger()
	az, _ := authFiles(t, sharesPolicy+"limits:\n  - principals: [alice]\n    max-connections: 1\n", "alice", "bob")
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{Config: &cfg, NoClient: true, Logger: log, Auth: az})
	ctx := testCtx(t, time.Minute)
	inspect := func(api lockdv1.LockServiceClient, p string) error {
		_, err := api.Inspect(as(ctx, p), &lockdv1.InspectRequest{Key: "k"})
		return err
	}
	a1, a2 := dial(t, srv.Addr), dial(t, srv.Addr)
	if err := inspect(a1, "alice"); err != nil {
		t.Fatalf("alice's first connection: %v", err)
	}
	wantLimit(t, "alice's second connection", inspect(a2, "alice"), wireerr.LimitPrincipalConnections)
	wantLimit(t, "alice's second connection, again", inspect(a2, "alice"), wireerr.LimitPrincipalConnections)
	// Alice's refused connection holds no slot: bob's two connections (his
	// share: 2, alice's is 1 by the policy) make
	// three open with hers (the global bound) plus hers refused.
	for i, b := range []lockdv1.LockServiceClient{dial(t, srv.Addr), dial(t, srv.Addr)} {
		if err := inspect(b, "bob"); err != nil {
			t.Fatalf("bob's connection %d while alice's second is refused: %v", i+1, err)
		}
	}
	if err := inspect(a1, "alice"); err != nil {
		t.Errorf("alice's first connection after the refusals: %v", err)
	}
	if n := counter(t, srv.Registry, "lockd_limit_rejections_total", map[string]string{"limit": wireerr.LimitPrincipalConnections}); n != 2 {
		t.Errorf("lockd_limit_rejections_total{limit=principal_connections} = %v; want 2", n)
	}
	if ev := logs.Events("principal_limit_reached"); len(ev) != 1 || ev[0]["by"] != "alice" || ev[0]["limit"] != wireerr.LimitPrincipalConnections {
		t.Errorf("principal_limit_reached events %v; want one, by alice, limit principal_connections", ev)
	}
}

// TestPrincipalInflightAndWaiters: alice's waiting acquire is a call in
// progress and a waiter; with shares of 1 her second waiting acquire is
// refused principal_waiters (max-inflight 2) or her next call
// principal_inflight (max-inflight 1), while bob's calls go on.
func TestPrincipalInflightAndWaiters(t *testing.T) {
	for _, tc := range []struct {
		name              string
		inflight, waiters int
		limit             string
	}{
		{"inflight", 1, 5, wireerr.LimitPrincipalInflight},
		{"waiters", 5, 1, wireerr.LimitPrincipalWaiters},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := lockdtest.Config()
			cfg.PrincipalMaxInflight, cfg.PrincipalMaxWaiters = tc.inflight, tc.waiters
			az, _ := authFiles(t, sharesPolicy, "alice", "bob")
			srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{Config: &cfg, NoClient: true, Auth: az})
			ctx, cancel := context.WithCancel(testCtx(t, time.Minute))
			defer cancel()
			api := dial(t, srv.Addr)
			open := func(p string) string {
				r, err := api.OpenSession(as(ctx, p), &lockdv1.OpenSessionRequest{TtlMs: 10_000})
				if err != nil {
					t.Fatalf("%s's OpenSession: %v", p, err)
				}
				return r.SessionId
			}
			bob, alice := open("bob"), open("alice")
			if _, err := api.Acquire(as(ctx, "bob"), &lockdv1.AcquireRequest{SessionId: bob, Key: "k"}); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			wg.Add(1)
			go func() { // ends when ctx is cancelled
				defer wg.Done()
				for { // again while the probe below took the waiter slot first
					_, err := api.Acquire(as(ctx, "alice"), &lockdv1.AcquireRequest{SessionId: alice, Key: "k", Wait: true})
					if wireerr.Limit(status.Convert(err)) != tc.limit {
						return
					}
				}
			}()
			testkit.Eventually(t, 30*time.Second, "alice's second waiting acquire refused "+tc.limit, func() bool {
				_, err := api.Acquire(as(ctx, "alice"), &lockdv1.AcquireRequest{SessionId: alice, Key: "k2", Wait: true, WaitTimeoutMs: 1})
				return wireerr.Limit(status.Convert(err)) == tc.limit
			})
			if _, err := api.Inspect(as(ctx, "bob"), &lockdv1.InspectRequest{Key: "k"}); err != nil {
				t.Errorf("bob's Inspect while alice is at her share: %v", err)
			}
			if n := counter(t, srv.Registry, "lockd_limit_rejections_total", map[string]string{"limit": tc.limit}); n < 1 {
				t.Errorf("lockd_limit_rejections_total{limit=%s} = %v; want ≥ 1", tc.limit, n)
			}
		})
	}
}

// TestPrincipalSessionOpensOverride: the policy's limits: entry gives
// alice 1 session open per second: of 6 opens at once, those beyond the
// first second's one are refused principal_session_opens while bob (the
// server's share, 16 per second) opens 6; after a reload without the entry
// alice opens 6 at once too.
func TestPrincipalSessionOpensOverride(t *testing.T) {
	az, pf := authFiles(t, sharesPolicy+"limits:\n  - principals: [alice]\n    max-session-opens: 1\n", "alice", "bob")
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{NoClient: true, Auth: az})
	ctx := testCtx(t, time.Minute)
	api := dial(t, srv.Addr)
	burst := func(p string) (opened, refused int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range 6 {
			wg.Add(1)
			go func() { // ends when the call returns
				defer wg.Done()
				_, err := api.OpenSession(as(ctx, p), &lockdv1.OpenSessionRequest{TtlMs: 10_000})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					opened++
				case wireerr.Limit(status.Convert(err)) == wireerr.LimitPrincipalSessionOpens:
					refused++
				default:
					t.Errorf("%s's OpenSession: %v", p, err)
				}
			}()
		}
		wg.Wait()
		return opened, refused
	}
	// 6 admissions within a second, unless the machine stalls for seconds.
	if opened, refused := burst("alice"); refused == 0 || opened > 5 {
		t.Errorf("alice's 6 opens at once with max-session-opens 1: %d opened, %d refused; want some refused principal_session_opens", opened, refused)
	}
	if opened, _ := burst("bob"); opened != 6 {
		t.Errorf("bob's 6 opens at once: %d opened; want 6 (his share is 16 per second)", opened)
	}
	if err := os.WriteFile(pf, []byte(sharesPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := az.Reload(); err != nil {
		t.Fatal(err)
	}
	if opened, _ := burst("alice"); opened != 6 {
		t.Errorf("alice's 6 opens at once after the reload without her entry: %d opened; want 6", opened)
	}
}

// TestRefusedConnectionClosed: a connection whose every lockd call is
// refused for a connection bound — over max-connections, or over its
// principal's share — is never authorised, so conn-auth-timeout closes it
// even though access control allows its calls (C2 #ct2-limits, C5
// #ct5-idle). Before, its first allowed call marked it authorised and it
// stayed open until the idle timeout (2 m).
func TestRefusedConnectionClosed(t *testing.T) {
	cfg := lockdtest.Config()
	cfg.MaxConnections, cfg.PrincipalMaxConnections = 2, 1
	cfg.ConnAuthTimeout = time.Second
	az, _ := authFiles(t, sharesPolicy+"limits:\n  - principals: [bob]\n    max-connections: 2\n", "alice", "bob")
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{Config: &cfg, NoClient: true, Auth: az})
	ctx := testCtx(t, time.Minute)
	dialConn := func() (*grpc.ClientConn, lockdv1.LockServiceClient) {
		conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn, lockdv1.NewLockServiceClient(conn)
	}
	inspect := func(api lockdv1.LockServiceClient, p string) error {
		_, err := api.Inspect(as(ctx, p), &lockdv1.InspectRequest{Key: "k"})
		return err
	}
	_, a1 := dialConn()
	if err := inspect(a1, "alice"); err != nil {
		t.Fatalf("alice's first connection: %v", err)
	}
	a2conn, a2 := dialConn()
	wantLimit(t, "alice's second connection", inspect(a2, "alice"), wireerr.LimitPrincipalConnections)
	_, b1 := dialConn()
	if err := inspect(b1, "bob"); err != nil {
		t.Fatalf("bob's connection: %v", err)
	}
	// Bob's second connection is within his share (2) but the third counted
	// (alice's second holds no slot): over max-connections.
	b2conn, b2 := dialConn()
	wantLimit(t, "bob's second connection", inspect(b2, "bob"), wireerr.LimitConnections)
	// Generous against load: the guard closes at the bound, the test waits
	// far longer for the effect.
	testkit.Eventually(t, 20*cfg.ConnAuthTimeout, "alice's and bob's refused connections closed by the server", func() bool {
		return a2conn.GetState() != connectivity.Ready && b2conn.GetState() != connectivity.Ready
	})
	if err := inspect(a1, "alice"); err != nil {
		t.Errorf("alice's first connection after her second was closed: %v", err)
	}
}
