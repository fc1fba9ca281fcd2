package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"lock.dev/lockd/store"
)

// DeadlockBound is C2 #ct2-deadlock's bound: a cycle of waiting Acquire
// calls is refused within it of the wait that closed it.
const DeadlockBound = 2 * time.Second

func (s *suite) testDeadlockTwo(t *testing.T)   { s.deadlockCycle(t, "dl2", 2, false) }
func (s *suite) testDeadlockThree(t *testing.T) { s.deadlockCycle(t, "dl3", 3, false) }
func (s *suite) testDeadlockNCycle(t *testing.T) {
	s.deadlockCycle(t, "dln", 8, false)
}
func (s *suite) testDeadlockOptOut(t *testing.T) { s.deadlockCycle(t, "dlo", 2, true) }

// deadlockCycle builds a cycle of n sessions over two instances (replicas):
// session i holds key i and waits for key i+1 (mod n), queued in order i,
// so the last wait closes the cycle. The youngest checking wait is refused
// within DeadlockBound (+ margin) with the cycle's keys — the last one, or
// with optOutLast (the last opted out with NoDeadlockCheck) the one before
// it — and nobody else's call returns; the victim's place is gone. Then
// the victim releases its key and every other session is granted its wait
// in turn, each releasing both of its keys.
func (s *suite) deadlockCycle(t *testing.T, prefix string, n int, optOutLast bool) {
	insts := s.instances(t, 2)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s/k%d", prefix, i)
	}
	ids := make([]store.SessionID, n)
	held := make([]store.Grant, n)
	for i := range n {
		ids[i] = openSession(t, insts[i%2])
		held[i] = mustTry(t, insts[i%2], ids[i], keys[i])
	}
	chans := make([]<-chan acquireResult, n)
	var closed time.Time
	for i := range n {
		var opts []store.AcquireOption
		if optOutLast && i == n-1 {
			opts = append(opts, store.NoDeadlockCheck())
		}
		closed = time.Now()
		chans[i] = startAcquire(t, ctx, insts[i%2], ids[i], keys[(i+1)%n], opts...)
		waitersAre(t, insts[(i+1)%2], keys[(i+1)%n], []store.SessionID{ids[i]})
	}
	victim := n - 1
	if optOutLast {
		victim = n - 2
	}
	r := recvResult(t, chans[victim], DeadlockBound+margin, fmt.Sprintf("victim %d (%s)", victim, ids[victim]))
	took := time.Since(closed)
	var de *store.DeadlockError
	if !errors.Is(r.err, store.ErrDeadlock) || !errors.As(r.err, &de) {
		t.Fatalf("victim %d: Acquire = %+v, %v; want ErrDeadlock", victim, r.g, r.err)
	}
	if want := slices.Sorted(slices.Values(keys)); !slices.Equal(de.Keys, want) {
		t.Fatalf("victim %d: keys %v; want %v", victim, de.Keys, want)
	}
	if store.IsRetryable(r.err) {
		t.Fatalf("victim %d: %v is retryable", victim, r.err)
	}
	t.Logf("%d-cycle refused %v after the closing wait was queued (bound %v)", n, took.Round(time.Millisecond), DeadlockBound)
	for i := range n {
		if i != victim {
			notReturned(t, chans[i], fmt.Sprintf("session %d beside the victim", i))
		}
	}
	waitersAre(t, insts[0], keys[(victim+1)%n], nil)
	// The victim gives its key up: the cycle unwinds backwards from it.
	mustRelease(t, insts[victim%2], held[victim])
	for step := 1; step < n; step++ {
		j := (victim - step + n) % n
		r := recvResult(t, chans[j], 15*time.Second, fmt.Sprintf("session %d after the victim released", j))
		if r.err != nil || r.g.Session != ids[j] || r.g.Key != keys[(j+1)%n] {
			t.Fatalf("session %d: Acquire = %+v, %v; want the grant of %q", j, r.g, r.err, keys[(j+1)%n])
		}
		for i := range n {
			if i != victim && i != j && (victim-i+n)%n > step {
				notReturned(t, chans[i], fmt.Sprintf("session %d while %d holds", i, j))
			}
		}
		mustRelease(t, insts[j%2], r.g)
		mustRelease(t, insts[j%2], held[j])
	}
}
