package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/server"
	"lock.dev/lockd/store"
)

// holdHeartbeats holds the heartbeats that reach f's store, from the next
// one on (every later one too when all is set), until release is called;
// entered is closed when the first one is held, and held counts those held.
func holdHeartbeats(f *lockdtest.Faulty, all bool) (entered <-chan struct{}, release func(), held func() int) {
	in, open := make(chan struct{}), make(chan struct{})
	var first, done sync.Once
	var n atomic.Int64
	var hook func()
	hook = func() { // runs inside a heartbeat's store call (Faulty.During)
		first.Do(func() { close(in) })
		select {
		case <-open:
			return
		default:
		}
		n.Add(1)
		if all {
			f.During(telemetry.OpHeartbeat, hook) // the next heartbeat waits too
		}
		<-open
	}
	f.During(telemetry.OpHeartbeat, hook)
	return in, func() { done.Do(func() { close(open) }) }, func() int { return int(n.Load()) }
}

// stallMoveTTL is the session TTL of the stall-move tests (the timing:
// TestStallMoveKeepsSlowReplica).
const stallMoveTTL = 10 * time.Second

// stallMoved is a holder that moved from replica A to replica B on a stall,
// A's heartbeat in flight answered at the instant of the move and B holding
// every heartbeat (until releaseB), or with bErrors answering every one with
// an error (until releaseB).
type stallMoved struct {
	a, b         *lockdtest.Server
	fa, fb       *lockdtest.Faulty
	s            *client.Session
	l            *client.Lock
	moved        time.Time
	releaseB     func()
	heldOnB      func() int
	answeredByA0 int // A's answers before its held one
}

// stallMove makes that: A and B over one namespace of backend with server
// configuration cfg (nil: lockdtest's).
func stallMove(t *testing.T, ctx context.Context, backend string, cfg *server.Config, bErrors bool) *stallMoved {
	t.Helper()
	ttl := stallMoveTTL
	ns := lockdtest.NewNamespace(t, backend)
	start := func() (*lockdtest.Server, *lockdtest.Faulty) {
		var f *lockdtest.Faulty
		srv := lockdtest.StartOn(t, ns, lockdtest.Options{NoClient: true, Config: cfg,
			Wrap: func(st store.LockStore) store.LockStore { f = lockdtest.NewFaulty(st); return f }})
		return srv, f
	}
	m := &stallMoved{}
	m.a, m.fa = start()
	m.b, m.fb = start()
	// B is cut off until the holder's heartbeat is held on A, so that the
	// client is on A then (a slow answer of A under load before the hold
	// would otherwise be a stall of its own).
	pb := testkit.NewProxy(t, m.b.Addr)
	pb.Cut()
	c, err := client.New(m.a.Addr, client.WithAddresses(m.a.Addr, pb.Addr()), client.WithHeartbeatInterval(time.Second),
		client.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatalf("client.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	m.s = newSession(t, ctx, c, client.WithSessionTTL(ttl))
	if m.l, err = m.s.Acquire(ctx, "k"); err != nil {
		t.Fatalf("Acquire: %v", err)
	}

	heldA, releaseA, _ := holdHeartbeats(m.fa, false)
	t.Cleanup(releaseA) // before the servers stop (cleanups run last first)
	var heldB <-chan struct{}
	if bErrors {
		// B's backend fails every heartbeat: B answers each with an error.
		reached := make(chan struct{})
		m.fb.During(telemetry.OpHeartbeat, func() { close(reached) })
		m.fb.Fail(telemetry.OpHeartbeat, store.ErrUnavailable)
		heldB, m.heldOnB = reached, func() int { return 0 }
		m.releaseB = func() { m.fb.Fail(telemetry.OpHeartbeat, nil) }
	} else {
		heldB, m.releaseB, m.heldOnB = holdHeartbeats(m.fb, true)
		t.Cleanup(m.releaseB)
	}
	select { // the holder's next heartbeat is in flight on A
	case <-heldA:
	case <-time.After(ttl):
		t.Fatalf("no heartbeat of the holder reached A within %v", ttl)
	}
	pb.Restore() // B reachable: the client may leave A now
	select {     // the client found A stalled and moved: its heartbeat reached B
	case <-heldB:
	case <-time.After(ttl / 2):
		t.Fatalf("no heartbeat reached B %v after A held one: the client did not move", ttl/2)
	}
	m.moved = time.Now()
	m.answeredByA0 = len(m.fa.Reported())
	releaseA() // A answers, after the stall bound, at the instant of the move
	return m
}

// TestStallMoveKeepsSlowReplica makes on purpose the session loss traced in
// parity rolling-restart on a three-member etcd (issue 21;
// docs/reliability.md): a replica that is slow but answering — its answer
// comes later than the stall bound, well inside the session's trust — and a
// replica to move to that answers nothing (it has to adopt the session and
// is slower still). Replica A holds the holder's heartbeat until the client
// has given up on it and sent one to B: A's answer arrives after the stall
// bound, in the instant the client decided to move. B holds every
// heartbeat. The client must keep the session on A's answers to heartbeats
// sent after the move (C2 #ct2-failover, "a stall move keeps sending").
// Before, the SDK sent nothing more on the stream it left: A's answer was
// the session's last, B never answered, the stall on B found A set aside
// and stayed, and the session expired:
//
//	the session was lost 8s after the stall move: client: session expired (deadline passed without acknowledgement)
//
// Proof that an answer came to a heartbeat sent after the move: a deadline
// later than the move plus the TTL. Every answer counts from its own send
// (C2 #ct2-deadline) with a Remaining of at most the TTL, and B answered
// nothing, so only A's answer to a heartbeat sent after the move can give
// one.
//
// Timing: the TTL (10 s) leaves at least 6 s of trust after an answer of A
// (Remaining ≥ TTL − TTL/3 on etcd, whose lease keepalives go every third
// of the TTL; the TTL on PostgreSQL; minus the 0.5 s margin), against a
// stall bound of half the 1 s heartbeat interval: nothing here waits on a
// wall-clock figure but that trust, which A's unheld answers do not come
// near on a loaded machine.
func TestStallMoveKeepsSlowReplica(t *testing.T) {
	const ttl = stallMoveTTL
	forBackends(t, func(t *testing.T, backend string) {
		ctx := testCtx(t, 2*time.Minute)
		m := stallMove(t, ctx, backend, nil, false)
		fa, fb, s, l, releaseB, heldOnB := m.fa, m.fb, m.s, m.l, m.releaseB, m.heldOnB

		answeredAfterMove(t, m)
		if n := len(fb.Reported()); n != 0 {
			t.Fatalf("B reported %d Remaining values while it held every heartbeat; want 0", n)
		}

		// B answers: the client stays there, and A is sent nothing more. At
		// most one heartbeat per session is in flight on A, so once B's
		// answers are in, A answers at most that one and one sent before the
		// client had them; five more answers of B (heartbeats the client
		// sent after, an interval apart) leave room for any other.
		releaseB()
		testkit.Eventually(t, ttl/2, "B's answers to the heartbeats it held", func() bool { return len(fb.Reported()) >= heldOnB() })
		nA, nB := len(fa.Reported()), len(fb.Reported())
		testkit.Eventually(t, 2*ttl, "five more heartbeats answered by B", func() bool { return len(fb.Reported()) >= nB+5 })
		if n := len(fa.Reported()); n > nA+2 {
			t.Errorf("A answered %d heartbeats after B's answers were in; want at most 2 (the stalled stream is sent nothing once the new one answers)", n-nA)
		}
		select {
		case <-l.Done():
			t.Fatalf("the lock was lost: %v", l.Err())
		case <-s.Done():
			t.Fatalf("the session was lost: %v", s.Err())
		default:
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release: %v", err)
		}
	})
}

// TestStallMoveStopsOnDrain: the replica a holder left on a stall, and
// still sends heartbeats to (C2 #ct2-failover, "a stall move keeps
// sending"), begins to drain. The client must send nothing more there, so
// that the stream ends once its heartbeats in flight are answered and the
// drain completes: the drain timeout (a minute) is beyond Stop's own 20 s
// bound, so a client that kept sending would hold the drain and fail Stop.
// The session lives on meanwhile (A answered after the move; then B).
func TestStallMoveStopsOnDrain(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		ctx := testCtx(t, 2*time.Minute)
		cfg := lockdtest.Config()
		cfg.DrainTimeout = time.Minute
		m := stallMove(t, ctx, backend, &cfg, false)
		// The stalled stream is sent heartbeats: A answers one sent after
		// the move (its held one, then at least one more).
		testkit.Eventually(t, stallMoveTTL, "A's answer to a heartbeat sent on the stalled stream", func() error {
			if n := len(m.fa.Reported()) - m.answeredByA0; n < 2 {
				return fmt.Errorf("A answered %d heartbeats since it held one; want its held one and one sent after the move", n)
			}
			return nil
		})
		stopped := make(chan error, 1)
		go func() { stopped <- m.a.Stop() }() // ends when A's drain and stop are done
		select {
		case err := <-stopped:
			if err != nil {
				t.Fatalf("Stop(A) (drain): %v; want the drain to end once the client sent nothing more on the stalled stream", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("A still draining 15s after its drain began: the client kept sending on the stalled stream")
		}
		m.releaseB()
		testkit.Eventually(t, stallMoveTTL/2, "a heartbeat answered by B", func() bool { return len(m.fb.Reported()) > 0 })
		if err := m.s.Err(); err != nil {
			t.Fatalf("the session was lost: %v", err)
		}
		if err := m.l.Err(); err != nil && !errors.Is(err, client.ErrReleased) {
			t.Fatalf("the lock was lost: %v", err)
		}
	})
}

// answeredAfterMove waits for A's answer to a heartbeat sent after the stall
// move: a session and lock deadline beyond the move plus the TTL (B answered
// no heartbeat live, and every answer counts from its own send with a
// Remaining of at most the TTL). It fails at once when the session or the
// lock is lost.
func answeredAfterMove(t *testing.T, m *stallMoved) {
	t.Helper()
	const ttl = stallMoveTTL
	s, l, moved := m.s, m.l, m.moved
	testkit.Eventually(t, 2*ttl, "an answer of A to a heartbeat sent after the stall move", func() error {
		select {
		case <-s.Done():
			t.Fatalf("the session was lost %v after the stall move: %v", time.Since(moved).Round(100*time.Millisecond), s.Err())
		case <-l.Done():
			t.Fatalf("the lock was lost %v after the stall move: %v", time.Since(moved).Round(100*time.Millisecond), l.Err())
		default:
		}
		if d, ld := s.Deadline(), l.Deadline(); !d.After(moved.Add(ttl)) || !ld.After(moved.Add(ttl)) {
			return fmt.Errorf("session deadline %v, lock deadline %v after the move; want beyond the TTL (%v)",
				d.Sub(moved).Round(time.Millisecond), ld.Sub(moved).Round(time.Millisecond), ttl)
		}
		return nil
	})
}

// TestStallMoveErrorAnswersKeepSending: the replica moved to on a stall (B)
// answers every heartbeat with an error (its backend fails them). An error
// answer, like a notice, does not show that B keeps the session, so the
// stalled stream must still be sent heartbeats until a stream moved to
// carries a live answer to one (C2 #ct2-failover, "a stall move keeps
// sending"). Before, any message on the new stream stopped them: B's first
// error answer ended the sends to A, A's answer at the instant of the move
// was the session's last, and the session expired:
//
//	the lock was lost 8s after the stall move: client: session expired (deadline passed without acknowledgement)
//
// Once B's heartbeats succeed, its first live answer stops the sends to A.
func TestStallMoveErrorAnswersKeepSending(t *testing.T) {
	const ttl = stallMoveTTL
	forBackends(t, func(t *testing.T, backend string) {
		ctx := testCtx(t, 2*time.Minute)
		m := stallMove(t, ctx, backend, nil, true)
		answeredAfterMove(t, m)
		if n := len(m.fb.Reported()); n != 0 {
			t.Fatalf("B reported %d Remaining values while its backend failed every heartbeat; want 0", n)
		}

		m.releaseB()
		testkit.Eventually(t, ttl/2, "a live answer of B", func() bool { return len(m.fb.Reported()) > 0 })
		nA, nB := len(m.fa.Reported()), len(m.fb.Reported())
		testkit.Eventually(t, 2*ttl, "five more heartbeats answered by B", func() bool { return len(m.fb.Reported()) >= nB+5 })
		if n := len(m.fa.Reported()); n > nA+2 {
			t.Errorf("A answered %d heartbeats after B's first live answer; want at most 2 (the stalled stream is sent nothing once the new one answers)", n-nA)
		}
		if err := m.s.Err(); err != nil {
			t.Fatalf("the session was lost: %v", err)
		}
		if err := m.l.Err(); err != nil {
			t.Fatalf("the lock was lost: %v", err)
		}
	})
}
