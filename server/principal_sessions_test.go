package server_test

import (
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

// TestPrincipalSessionShare (both backends): under a policy, alice keeps at
// most her share of sessions (lock.server.principal.max-sessions, C5
// #ct5-principal-limits, issue 23 F3); her next OpenSession is refused
// LIMIT principal_sessions, counted without her name and logged
// (principal_limit_reached), while bob still opens a session and acquires.
func TestPrincipalSessionShare(t *testing.T) {
	for _, be := range lockdtest.Backends {
		t.Run(be, func(t *testing.T) {
			cfg := lockdtest.Config()
			cfg.PrincipalMaxSessions = 2
			log, logs := testkit.NewLogger()
			opts := lockdtest.Options{Config: &cfg, NoClient: true, Logger: log}
			opts.Auth, _ = authFiles(t, sharesPolicy, "alice", "bob")
			srv := lockdtest.StartBackend(t, be, opts)
			conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			api := lockdv1.NewLockServiceClient(conn)
			ctx := testCtx(t, time.Minute)
			open := func(p string) (*lockdv1.OpenSessionResponse, error) {
				return api.OpenSession(as(ctx, p), &lockdv1.OpenSessionRequest{TtlMs: 30_000})
			}
			for i := range 2 {
				if _, err := open("alice"); err != nil {
					t.Fatalf("alice's session %d within her share: %v", i, err)
				}
			}
			_, err = open("alice")
			if st := status.Convert(err); st.Code() != codes.ResourceExhausted || wireerr.Limit(st) != wireerr.LimitPrincipalSessions ||
				!strings.Contains(st.Message(), "lock.server.principal.max-sessions") {
				t.Fatalf("alice's session beyond her share: %v; want LIMIT principal_sessions naming the key", err)
			}
			bob, err := open("bob")
			if err != nil {
				t.Fatalf("bob's session while alice is at her share: %v", err)
			}
			if _, err := api.Acquire(as(ctx, "bob"), &lockdv1.AcquireRequest{SessionId: bob.SessionId,
				SessionSecret: bob.SessionSecret, Key: "jobs/bob"}); err != nil {
				t.Fatalf("bob's acquire while alice is at her share: %v", err)
			}
			if n := counter(t, srv.Registry, "lockd_limit_rejections_total",
				map[string]string{"limit": wireerr.LimitPrincipalSessions}); n != 1 {
				t.Errorf("lockd_limit_rejections_total{limit=principal_sessions} = %v; want 1", n)
			}
			if ev := logs.Events("principal_limit_reached"); len(ev) != 1 || ev[0]["by"] != "alice" ||
				ev[0]["limit"] != wireerr.LimitPrincipalSessions || ev[0]["method"] != "OpenSession" {
				t.Errorf("principal_limit_reached events %v; want one, by alice, limit principal_sessions, OpenSession", ev)
			}
		})
	}
}
