package server_test

import (
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

// TestCloseSessions (both backends; C2 #ct2-close-sessions, issue 23 F3):
// an admin on every key closes every session of alice — her locks are
// released, each close is audited session_closed with the admin's by and
// rule — while bob's session stays; alice and bob (lock only) and an admin
// of a narrower prefix are refused ACCESS_DENIED; no principal is
// INVALID_ARGUMENT.
func TestCloseSessions(t *testing.T) {
	const policy = `
rules:
  - name: ops
    principals: [root]
    prefixes: ["*"]
    allow: [read, lock, admin]
  - name: narrow
    principals: [jobsadmin]
    prefixes: [jobs/]
    allow: [read, lock, admin]
  - name: users
    principals: [alice, bob]
    prefixes: ["*"]
    allow: [read, lock]
`
	forBackends(t, func(t *testing.T, be string) {
		log, logs := testkit.NewLogger()
		opts := lockdtest.Options{NoClient: true, Logger: log}
		opts.Auth, _ = authFiles(t, policy, "root", "jobsadmin", "alice", "bob")
		srv := lockdtest.StartBackend(t, be, opts)
		conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		api := lockdv1.NewLockServiceClient(conn)
		ctx := testCtx(t, time.Minute)
		open := func(p string) *lockdv1.OpenSessionResponse {
			t.Helper()
			s, err := api.OpenSession(as(ctx, p), &lockdv1.OpenSessionRequest{TtlMs: 60_000})
			if err != nil {
				t.Fatalf("OpenSession as %s: %v", p, err)
			}
			return s
		}
		a1, a2, b1 := open("alice"), open("alice"), open("bob")
		if _, err := api.Acquire(as(ctx, "alice"), &lockdv1.AcquireRequest{SessionId: a1.SessionId,
			SessionSecret: a1.SessionSecret, Key: "jobs/a"}); err != nil {
			t.Fatal(err)
		}

		for _, p := range []string{"alice", "bob", "jobsadmin"} {
			_, err := api.CloseSessions(as(ctx, p), &lockdv1.CloseSessionsRequest{Principal: "alice"})
			if st := status.Convert(err); st.Code() != codes.PermissionDenied || wireerr.Reason(st) != wireerr.ReasonAccessDenied {
				t.Errorf("CloseSessions as %s: %v; want PERMISSION_DENIED ACCESS_DENIED", p, err)
			}
		}
		if _, err := api.CloseSessions(as(ctx, "root"), &lockdv1.CloseSessionsRequest{}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("CloseSessions without a principal: %v; want INVALID_ARGUMENT", err)
		}
		resp, err := api.CloseSessions(as(ctx, "root"), &lockdv1.CloseSessionsRequest{Principal: "alice"})
		if err != nil || resp.Closed != 2 || resp.Released != 1 {
			t.Fatalf("CloseSessions(alice) as root = %v, %v; want closed 2, released 1", resp, err)
		}
		for _, s := range []*lockdv1.OpenSessionResponse{a1, a2} {
			if _, err := api.Acquire(as(ctx, "alice"), &lockdv1.AcquireRequest{SessionId: s.SessionId,
				SessionSecret: s.SessionSecret, Key: "jobs/b"}); wireerr.Reason(status.Convert(err)) != wireerr.ReasonSessionDead {
				t.Errorf("alice's session %s after CloseSessions: Acquire %v; want SESSION_DEAD", s.SessionId, err)
			}
		}
		if _, err := api.Acquire(as(ctx, "bob"), &lockdv1.AcquireRequest{SessionId: b1.SessionId,
			SessionSecret: b1.SessionSecret, Key: "jobs/a"}); err != nil {
			t.Errorf("bob's session after CloseSessions(alice): Acquire jobs/a (alice's, released) %v; want granted", err)
		}
		closed := map[string]bool{}
		for _, ev := range logs.Events("session_closed") {
			if ev["by"] == "root" && ev["rule"] == "ops" {
				closed[ev["session"].(string)] = true
			}
		}
		if !closed[a1.SessionId] || !closed[a2.SessionId] || len(closed) != 2 {
			t.Errorf("session_closed by root, rule ops: %v; want alice's two sessions", closed)
		}
	})
}
