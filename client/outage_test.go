package client_test

import (
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestReconnectAfterCut: the connection to lockd is cut for less than the
// session's trust window; the SDK reconnects its KeepAlive stream and the
// session and its lock survive.
func TestReconnectAfterCut(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		proxy := testkit.NewProxy(t, srv.Addr)
		c, err := client.New(proxy.Addr(), client.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ctx := testCtx(t, 60*time.Second)
		s := newSession(t, ctx, c)
		l, err := s.Acquire(ctx, "k")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		proxy.Cut()
		<-time.After(500 * time.Millisecond) // the outage
		proxy.Restore()
		restored := time.Now()
		testkit.Eventually(t, 10*time.Second, "deadline extended after the outage", func() bool {
			return s.Deadline().After(restored.Add(lockdtest.TTL / 2))
		})
		if closed(s.Done()) || closed(l.Done()) {
			t.Fatalf("session or lock ended by a short outage: %v / %v", s.Err(), l.Err())
		}
		info, err := srv.Client.Inspect(ctx, "k")
		if err != nil || info.Session != s.ID() || info.Token != l.Token() {
			t.Errorf("Inspect(k) after the outage = %+v, %v; want still held by %s", info, err, s.ID())
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release after the outage: %v", err)
		}
	})
}

// TestPartitionNoOverlap: the holder is partitioned from lockd (connections
// open, nothing arrives). It stops trusting its lock at its local deadline;
// the server closes its silent session later, and only then is the waiter
// granted the key: the two never trust the lock at the same time.
func TestPartitionNoOverlap(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		proxy := testkit.NewProxy(t, srv.Addr)
		holderClient, err := client.New(proxy.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { holderClient.Close() })
		ctx := testCtx(t, 60*time.Second)
		holder := newSession(t, ctx, holderClient)
		hl, err := holder.Acquire(ctx, "k")
		if err != nil {
			t.Fatalf("holder Acquire: %v", err)
		}
		holderDone := make(chan time.Time, 1)
		go func() {
			<-hl.Done()
			holderDone <- time.Now()
		}()
		waiter := newSession(t, ctx, srv.Client)
		type result struct {
			l   *client.Lock
			err error
			at  time.Time
		}
		got := make(chan result, 1)
		go func() {
			l, err := waiter.Acquire(ctx, "k")
			got <- result{l, err, time.Now()}
		}()
		testkit.Eventually(t, 10*time.Second, "waiter queued", func() bool {
			info, err := srv.Client.Inspect(ctx, "k")
			return err == nil && len(info.Waiters) == 1
		})
		partitioned := time.Now()
		proxy.Pause()
		r := <-got
		if r.err != nil {
			t.Fatalf("waiter Acquire: %v", r.err)
		}
		var doneAt time.Time
		select {
		case doneAt = <-holderDone:
		default:
			t.Fatalf("waiter granted %v after the partition while the holder still trusts its lock", r.at.Sub(partitioned))
		}
		if !doneAt.Before(r.at) {
			t.Errorf("holder trusted until %v, waiter granted at %v (after the partition): overlap", doneAt.Sub(partitioned), r.at.Sub(partitioned))
		}
		if r.l.Token() <= hl.Token() {
			t.Errorf("waiter token %d; want > holder's %d", r.l.Token(), hl.Token())
		}
		t.Logf("after the partition: holder stopped trusting at %v, waiter granted at %v",
			doneAt.Sub(partitioned).Round(time.Millisecond), r.at.Sub(partitioned).Round(time.Millisecond))
		proxy.Restore()
	})
}
