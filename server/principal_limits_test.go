package server_test

import (
	"context"
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

// TestPrincipalShares: under a policy, one principal holds at most its
// share of the streams and of the watches (C5 #ct5-principal-limits, issue
// 23 F2, F4): alice's watch beyond her share is refused LIMIT
// principal_watches or principal_streams while bob still opens one; the
// refusal is counted and logged (principal_limit_reached). Without a policy
// the shares do not apply.
func TestPrincipalShares(t *testing.T) {
	for _, tc := range []struct {
		name             string
		streams, watches int
		limit            string
		policy           bool
	}{
		{"watches", 8, 2, wireerr.LimitPrincipalWatches, true},
		{"streams", 2, 8, wireerr.LimitPrincipalStreams, true},
		{"no policy", 2, 2, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := lockdtest.Config()
			cfg.PrincipalMaxStreams, cfg.PrincipalMaxWatches = tc.streams, tc.watches
			log, logs := testkit.NewLogger()
			opts := lockdtest.Options{Config: &cfg, NoClient: true, Logger: log}
			if tc.policy {
				opts.Auth, _ = authFiles(t, sharesPolicy, "alice", "bob")
			}
			srv := lockdtest.StartBackend(t, lockdtest.Backends[0], opts)
			conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			api := lockdv1.NewLockServiceClient(conn)
			ctx, cancel := context.WithCancel(testCtx(t, time.Minute))
			defer cancel()
			watch := func(p string) error {
				cctx := ctx
				if tc.policy {
					cctx = as(ctx, p) // without a policy there are no tokens: all anonymous
				}
				w, err := api.Watch(cctx, &lockdv1.WatchRequest{Prefix: "w/"})
				if err != nil {
					return err
				}
				if _, err := w.Header(); err != nil {
					return err
				}
				if md, _ := w.Header(); len(md) == 0 {
					_, err := w.Recv() // refused before it was established
					return err
				}
				return nil
			}
			for i := range 2 {
				if err := watch("alice"); err != nil {
					t.Fatalf("alice's watch %d within her share: %v", i, err)
				}
			}
			err = watch("alice")
			if tc.limit == "" {
				if err != nil {
					t.Fatalf("alice's third watch without a policy: %v; want no share applied", err)
				}
				return
			}
			if st := status.Convert(err); st.Code() != codes.ResourceExhausted || wireerr.Limit(st) != tc.limit {
				t.Fatalf("alice's watch beyond her share: %v; want LIMIT %s", err, tc.limit)
			}
			if err := watch("bob"); err != nil {
				t.Errorf("bob's watch while alice is at her share: %v", err)
			}
			if n := counter(t, srv.Registry, "lockd_limit_rejections_total", map[string]string{"limit": tc.limit}); n != 1 {
				t.Errorf("lockd_limit_rejections_total{limit=%s} = %v; want 1", tc.limit, n)
			}
			if ev := logs.Events("principal_limit_reached"); len(ev) != 1 || ev[0]["by"] != "alice" || ev[0]["limit"] != tc.limit {
				t.Errorf("principal_limit_reached events %v; want one, by alice, limit %s", ev, tc.limit)
			}
		})
	}
}
