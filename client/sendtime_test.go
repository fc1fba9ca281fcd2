package client_test

import (
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// TestDeadlineFromSendTime checks the send-time rule of C2 #ct2-deadline
// with a clock that moves while a request is at the server: the SDK's clock
// advances 1s inside OpenSession, a heartbeat and an Acquire (a slow round
// trip), and each deadline must still be send + Remaining − margin, not
// receive + Remaining − margin. A build with -tags lockd_recvtime_control
// (an SDK that counts from the receipt of the reply) fails it.
func TestDeadlineFromSendTime(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		var faulty *lockdtest.Faulty
		clock := newFakeClock()
		const (
			// With the grid's phase at a quarter (below), the heartbeats
			// after the first (sent at t0+1s) leave at t0+2.5s, 4.5s, …:
			// the 1s the first spends at the server does not bring the
			// next one due. At a random phase it could leave at t0+2s,
			// and its answer then gives the receive-time deadline too.
			interval = 2 * time.Second
			rtt      = time.Second // how far the clock moves while a request is at the server
			rem      = 10 * time.Second
		)
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{
			// A long real TTL: heartbeats follow the fake clock.
			ClientOptions: []client.Option{client.WithClock(clock), client.WithHeartbeatInterval(interval),
				client.WithTTL(time.Minute)},
			Wrap: func(st store.LockStore) store.LockStore { faulty = lockdtest.NewFaulty(st); return faulty }})
		// The grid's instants are t0 + 0.5s + n×2s: the client was made
		// at t0, and nothing moves the fake clock before the open.
		client.SetHeartbeatPhase(srv.Client, 0.25)
		ctx := testCtx(t, 60*time.Second)
		margin := lockdtest.SafetyMargin
		faulty.SetRemaining(rem)
		advance := func() { clock.Advance(rtt) }

		// OpenSession, then the first heartbeat, which the new KeepAlive
		// stream sends at once: it waits at the server until the open's
		// deadline is checked.
		proceed := make(chan struct{})
		faulty.During(telemetry.OpOpenSession, advance)
		faulty.During(telemetry.OpHeartbeat, func() { <-proceed; advance() })
		t0 := clock.Now()
		s := newSession(t, ctx, srv.Client)
		if got := clock.Now().Sub(t0); got != rtt {
			close(proceed)
			t.Fatalf("the clock moved %v during OpenSession; want %v (During hook)", got, rtt)
		}
		want := t0.Add(rem - margin)
		got := s.Deadline()
		close(proceed)
		if !got.Equal(want) {
			t.Fatalf("deadline after OpenSession sent at t0 and answered at t0%+v = t0%+v; want t0%+v = send + "+
				"Remaining − margin", rtt, got.Sub(t0), want.Sub(t0))
		}
		// The heartbeat was sent at t0+rtt (nothing moves the clock in
		// between) and answered at t0+2rtt.
		sent := t0.Add(rtt)
		testkit.Eventually(t, 10*time.Second, "first heartbeat answered and applied", func() bool {
			return !s.Deadline().Equal(want)
		})
		if got, want := s.Deadline(), sent.Add(rem-margin); !got.Equal(want) {
			t.Fatalf("deadline after the heartbeat sent at t0%+v and answered at t0%+v = t0%+v; want t0%+v = send + "+
				"Remaining − margin", sent.Sub(t0), clock.Now().Sub(t0), got.Sub(t0), want.Sub(t0))
		}

		// An Acquire. The 1s at the server brings the next heartbeat due
		// (t0+2.5s): it fails, so only the grant can move the deadline.
		faulty.Fail(telemetry.OpHeartbeat, store.ErrUnavailable)
		faulty.During(telemetry.OpAcquire, advance)
		sent = clock.Now()
		if _, err := s.Acquire(ctx, "k"); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if got := clock.Now().Sub(sent); got != rtt {
			t.Fatalf("the clock moved %v during Acquire; want %v (During hook)", got, rtt)
		}
		if got, want := s.Deadline(), sent.Add(rem-margin); !got.Equal(want) {
			t.Fatalf("deadline after the Acquire sent at t0%+v and answered at t0%+v = t0%+v; want t0%+v = send + "+
				"Remaining − margin", sent.Sub(t0), clock.Now().Sub(t0), got.Sub(t0), want.Sub(t0))
		}
	})
}
