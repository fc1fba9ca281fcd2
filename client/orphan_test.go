package client_test

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// TestOrphanGrantReleased: the session holds a grant that no Lock and no
// call of the SDK knows (here taken with the session's secret behind the
// SDK's back; in life, a kept queue place handed the key after its Acquire
// gave up and its LeaveQueue was lost). The next heartbeat answer lists it
// and the SDK releases it (C2 #ct2-keep-place); before, it stayed held
// until the session ended.
func TestOrphanGrantReleased(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true})
		c, err := client.New(srv.Addr, client.WithBackoff(10*time.Millisecond, 100*time.Millisecond),
			client.WithDialOptions(lockdtest.SessionSecrets()...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ctx := testCtx(t, 60*time.Second)
		s := newSession(t, ctx, c)
		kept, err := s.Acquire(ctx, "kept")
		if err != nil {
			t.Fatalf("Acquire(kept): %v", err)
		}
		conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		api := lockdv1.NewLockServiceClient(conn)
		g, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: s.ID(), Key: "orphan",
			SessionSecret: lockdtest.SessionSecret(s.ID())})
		if err != nil || !g.Granted {
			t.Fatalf("raw Acquire(orphan) for the SDK's session = %v, %v", g, err)
		}
		testkit.Eventually(t, lockdtest.TTL+2*time.Second, "the orphan grant released by the SDK", func() bool {
			r, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: "orphan"})
			return err == nil && !r.Held
		})
		if closed(kept.Done()) {
			t.Errorf("the SDK's own lock ended (%v); want only the orphan released", kept.Err())
		}
		r, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: "kept"})
		if err != nil || !r.Held || r.Lock.GetToken() != kept.Token() {
			t.Errorf("Inspect(kept) = %v, %v; want held with token %d", r, err, kept.Token())
		}
	})
}
