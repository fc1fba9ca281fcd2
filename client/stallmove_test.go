package client_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
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
	const ttl = 10 * time.Second
	forBackends(t, func(t *testing.T, backend string) {
		ns := lockdtest.NewNamespace(t, backend)
		start := func() (*lockdtest.Server, *lockdtest.Faulty) {
			var f *lockdtest.Faulty
			srv := lockdtest.StartOn(t, ns, lockdtest.Options{NoClient: true,
				Wrap: func(st store.LockStore) store.LockStore { f = lockdtest.NewFaulty(st); return f }})
			return srv, f
		}
		a, fa := start()
		b, fb := start()
		// B is cut off until the holder's heartbeat is held on A, so that
		// the client is on A then (a slow answer of A under load before the
		// hold would otherwise be a stall of its own).
		pb := testkit.NewProxy(t, b.Addr)
		pb.Cut()
		ctx := testCtx(t, 2*time.Minute)
		c, err := client.New(a.Addr, client.WithAddresses(a.Addr, pb.Addr()), client.WithHeartbeatInterval(time.Second),
			client.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
		if err != nil {
			t.Fatalf("client.New: %v", err)
		}
		t.Cleanup(func() { _ = c.Close() })
		s := newSession(t, ctx, c, client.WithSessionTTL(ttl))
		l, err := s.Acquire(ctx, "k")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}

		heldA, releaseA, _ := holdHeartbeats(fa, false)
		t.Cleanup(releaseA) // before the servers stop (cleanups run last first)
		heldB, releaseB, heldOnB := holdHeartbeats(fb, true)
		t.Cleanup(releaseB)
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
		moved := time.Now()
		releaseA() // A answers, after the stall bound, at the instant of the move

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
