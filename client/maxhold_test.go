package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// TestOmittedPastMaxHoldIsErrMaxHold (C2 #ct2-maxhold-sdk, MAXHOLD-1): a
// heartbeat answer that no longer lists a lock granted with a maximum hold
// m, with no lock-lost notice (every notice is stripped on the wire, as
// when the server's held set saw the backend's revoke before its lock-loss
// watch made the notice), ends the lock with ErrMaxHold once the client's
// clock reads the Acquire's send time plus m, and with plain ErrLockLost
// before (the control: 1 ns before, the hold cannot be why). The client
// runs on a fake clock; the omissions are made on purpose with Revoke, and
// m (10 minutes) is far beyond the test's real time, so the server's own
// hold timer never fires in it. Before the rule both ended ErrLockLost.
func TestOmittedPastMaxHoldIsErrMaxHold(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		const (
			interval = time.Second
			hold     = 10 * time.Minute
			rem      = time.Hour // every answer's Remaining: the session outlives the fake hour
		)
		strip := grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn,
			method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			cs, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil || method != lockdv1.LockService_KeepAlive_FullMethodName {
				return cs, err
			}
			return stripNotices{cs}, nil
		})
		var faulty *lockdtest.Faulty
		clock := newFakeClock()
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{
			ClientOptions: []client.Option{client.WithClock(clock), client.WithHeartbeatInterval(interval),
				client.WithTTL(time.Minute), client.WithDialOptions(strip)},
			Wrap: func(st store.LockStore) store.LockStore { faulty = lockdtest.NewFaulty(st); return faulty }})
		faulty.SetRemaining(rem)
		ctx := testCtx(t, 60*time.Second)
		s := newSession(t, ctx, srv.Client)
		t0 := clock.Now() // the send time of both Acquires: the fake clock has not moved
		early, err := s.Acquire(ctx, "early", client.WithMaxHold(hold))
		if err != nil {
			t.Fatalf("Acquire(early): %v", err)
		}
		late, err := s.Acquire(ctx, "late", client.WithMaxHold(hold))
		if err != nil {
			t.Fatalf("Acquire(late): %v", err)
		}
		// advance moves the fake clock by d once a heartbeat is scheduled
		// within a heartbeat interval, so that one goes at the new time.
		advance := func(d time.Duration) {
			t.Helper()
			now := clock.Now()
			testkit.Eventually(t, 10*time.Second, "next heartbeat scheduled", func() bool {
				return clock.pending(now, now.Add(interval))
			})
			clock.Advance(d)
		}
		lostWith := func(l *client.Lock, what string) error {
			t.Helper()
			select {
			case <-l.Done():
			case <-time.After(10 * time.Second):
				t.Fatalf("%s still trusted 10s after a heartbeat sent after its revoke (fake now t0 + %v)", what, clock.Now().Sub(t0))
			}
			if closed(s.Done()) {
				t.Fatalf("session ended (%v); want only the lock lost", s.Err())
			}
			return l.Err()
		}

		// The control: omitted 1 ns before t0 + m.
		if _, err := srv.Client.Revoke(ctx, "early"); err != nil {
			t.Fatalf("Revoke(early): %v", err)
		}
		advance(hold - 1) // the heartbeat goes at t0 + m − 1 ns, after the revoke
		if err := lostWith(early, "early"); !errors.Is(err, client.ErrLockLost) || errors.Is(err, client.ErrMaxHold) {
			t.Errorf("lock omitted at t0 + %v, before its maximum hold could end it: Err = %v; want ErrLockLost, not ErrMaxHold",
				clock.Now().Sub(t0), err)
		}
		// That heartbeat answered (it listed late): no answer composed
		// before late's revoke is still on its way.
		sent := t0.Add(hold - 1)
		testkit.Eventually(t, 10*time.Second, "the heartbeat sent at t0 + m − 1 ns answered", func() bool {
			return s.Deadline().Equal(sent.Add(rem - lockdtest.SafetyMargin))
		})
		if closed(late.Done()) {
			t.Fatalf("late lock ended before its revoke: %v", late.Err())
		}

		// Omitted at or past t0 + m: ErrMaxHold, which is ErrLockLost too.
		if _, err := srv.Client.Revoke(ctx, "late"); err != nil {
			t.Fatalf("Revoke(late): %v", err)
		}
		advance(interval) // the next heartbeat goes at t0 + m − 1 ns + 1 s at the earliest
		if err := lostWith(late, "late"); !errors.Is(err, client.ErrMaxHold) || !errors.Is(err, client.ErrLockLost) {
			t.Errorf("lock omitted at t0 + %v, past its maximum hold %v, no notice: Err = %v; want ErrMaxHold (and ErrLockLost)",
				clock.Now().Sub(t0), hold, err)
		}
	})
}
