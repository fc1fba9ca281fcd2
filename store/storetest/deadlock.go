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

// testDeadlockDissolved (issue 26 §3, C2 #ct2-deadlock): a cycle that
// dissolves between the detector's first and second sighting is never
// refused. The scans of the victim's instance are let through one by one
// (store.DeadlockScanGater). A holds a on instance 0, B holds b on
// instance 1; A waits for b, then B for a: B's wait closes the cycle and
// is its victim. Scan 1 of instance 1 sees the cycle; then
//   - waiter-leaves: A cancels its wait; scans 2 and 3 see no cycle; B is
//     not refused and is granted a once A releases it;
//   - holder-releases: A releases a; B is granted a (not refused), and A
//     is granted b once B releases it;
//   - control: the cycle stays; scan 2 sees it again and B is refused
//     with the cycle's keys (the gate really drives the refusal).
func (s *suite) testDeadlockDissolved(t *testing.T) {
	for _, mode := range []string{"waiter-leaves", "holder-releases", "control"} {
		t.Run(mode, func(t *testing.T) { s.deadlockDissolved(t, mode) })
	}
}

func (s *suite) deadlockDissolved(t *testing.T, mode string) {
	insts := s.instances(t, 2)
	gate := newScanGate(t, insts[1])
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	ka, kb := "dld/"+mode+"/a", "dld/"+mode+"/b"
	a, b := openSession(t, insts[0]), openSession(t, insts[1])
	ha, hb := mustTry(t, insts[0], a, ka), mustTry(t, insts[1], b, kb)
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	aw := startAcquire(t, actx, insts[0], a, kb)
	waitersAre(t, insts[1], kb, []store.SessionID{a})
	bw := startAcquire(t, ctx, insts[1], b, ka)
	waitersAre(t, insts[0], ka, []store.SessionID{b})
	// Scan 1 reads the graph after both waits are queued: the cycle, seen
	// once. The next scan at the gate means scan 1 is over.
	gate.scan(t, "scan 1 (the cycle)")
	select {
	case <-gate.entered: // scan 2
	case r := <-bw:
		t.Fatalf("B's Acquire returned after the cycle was seen by one scan: %+v, %v; "+
			"want it waiting (refused only when two consecutive scans see it)", r.g, r.err)
	case <-time.After(15 * time.Second):
		t.Fatal("scan 2: no deadlock scan reached the gate within 15 s")
	}
	switch mode {
	case "control":
		gate.release()
		r := recvResult(t, bw, DeadlockBound+margin, "B, the victim of a cycle seen twice")
		var de *store.DeadlockError
		if !errors.As(r.err, &de) || !slices.Equal(de.Keys, []string{ka, kb}) {
			t.Fatalf("control: B's Acquire = %+v, %v; want ErrDeadlock over [%s %s] after the second scan", r.g, r.err, ka, kb)
		}
		mustRelease(t, insts[1], hb)
		r = recvResult(t, aw, 15*time.Second, "A after B released b")
		if r.err != nil || r.g.Session != a || r.g.Key != kb {
			t.Fatalf("A: Acquire = %+v, %v; want the grant of %q", r.g, r.err, kb)
		}
		mustRelease(t, insts[0], r.g)
		mustRelease(t, insts[0], ha)
	case "waiter-leaves":
		acancel()
		r := recvResult(t, aw, 15*time.Second, "A's cancelled wait")
		wantErr(t, "A's cancelled wait", r.err, context.Canceled)
		waitersAre(t, insts[1], kb, nil)
		gate.release()
		gate.scan(t, "scan 3")
		gate.arrive(t, "scan 4") // scans 2 and 3 are over: no cycle in either
		notReturned(t, bw, "B after two scans without the cycle")
		mustRelease(t, insts[0], ha)
		r = recvResult(t, bw, 15*time.Second, "B after A released a")
		if r.err != nil || r.g.Session != b || r.g.Key != ka {
			t.Fatalf("B: Acquire = %+v, %v; want the grant of %q (the cycle dissolved after one scan: no deadlock)", r.g, r.err, ka)
		}
		mustRelease(t, insts[1], r.g)
		mustRelease(t, insts[1], hb)
	case "holder-releases":
		mustRelease(t, insts[0], ha)
		r := recvResult(t, bw, 15*time.Second, "B after A released a")
		if r.err != nil || r.g.Session != b || r.g.Key != ka {
			t.Fatalf("B: Acquire = %+v, %v; want the grant of %q (the cycle dissolved after one scan: no deadlock)", r.g, r.err, ka)
		}
		gate.release()
		mustRelease(t, insts[1], r.g)
		mustRelease(t, insts[1], hb)
		r = recvResult(t, aw, 15*time.Second, "A after B released b")
		if r.err != nil || r.g.Session != a || r.g.Key != kb {
			t.Fatalf("A: Acquire = %+v, %v; want the grant of %q", r.g, r.err, kb)
		}
		mustRelease(t, insts[0], r.g)
	}
}

// scanGate holds an instance's deadlock scans at its gate
// (store.DeadlockScanGater) and lets them read one at a time.
type scanGate struct {
	entered, proceed, done chan struct{}
}

func newScanGate(t *testing.T, st store.LockStore) *scanGate {
	t.Helper()
	sg, ok := st.(store.DeadlockScanGater)
	if !ok {
		t.Fatalf("storetest: %T does not implement store.DeadlockScanGater (C2 #ct2-deadlock, Test hook)", st)
	}
	g := &scanGate{entered: make(chan struct{}), proceed: make(chan struct{}), done: make(chan struct{})}
	sg.SetDeadlockScanGate(func(ctx context.Context) {
		select {
		case g.entered <- struct{}{}:
		case <-ctx.Done():
			return
		case <-g.done:
			return
		}
		select {
		case <-g.proceed:
		case <-ctx.Done():
		case <-g.done:
		}
	})
	t.Cleanup(func() { // before the instance's Close (cleanups run last first)
		sg.SetDeadlockScanGate(nil)
		close(g.done)
	})
	return g
}

// arrive waits until a scan waits at the gate: the scan before it is over.
func (g *scanGate) arrive(t *testing.T, what string) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: no deadlock scan reached the gate within 15 s", what)
	}
}

// release lets the scan at the gate read the graph.
func (g *scanGate) release() { g.proceed <- struct{}{} }

// scan lets the next scan read the graph.
func (g *scanGate) scan(t *testing.T, what string) {
	t.Helper()
	g.arrive(t, what)
	g.release()
}
