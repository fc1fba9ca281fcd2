package runner

import (
	"context"
	"fmt"
	"time"

	"lock.dev/lockd/test/chaos/worker"
)

// Issue 26 §3: deadlocks refused, under a load that closes cycles.

// DeadlockPairs runs pair workers (worker.Config.Pairs) on the scenario's
// two keys, the even slots in one order and the odd ones in the other:
// each takes its first key and, holding it, waits for its second, so two
// workers of opposite orders close a cycle of waits that lockd must break
// by refusing one (C2 #ct2-deadlock). A cycle is the scenario's fault:
// each fault cycle waits until two workers of opposite orders wait for
// their second key at once (a cycle closed) and then until both stopped
// waiting. check.DeadlocksResolved judges every cycle in the histories.
const DeadlockPairs Fault = "deadlock-pairs"

// DeadlockOff runs DeadlockPairs on lockd built with the tag
// lockd_deadlock_off_control (store/internal/deadlock/control_off.go): the
// detector never refuses, so a cycle stays closed until the workers' wait
// timeout (worker.PairWait), and check.DeadlocksResolved must find it.
const DeadlockOff Control = "deadlock-off"

// deadlockBound is check.DeadlocksResolved's bound: C2 #ct2-deadlock's 2 s
// plus the liveness slack (a loaded machine; the history's times are the
// workers', taken before the server registers a wait). worker.PairWait is
// twice it, so a cycle the detector leaves alone exceeds it by seconds.
func (r *run) deadlockBound() time.Duration { return 2*time.Second + r.opts.LivenessSlack }

// deadlocks reports whether the scenario is DeadlockPairs.
func (r *run) deadlocks() bool { return r.spec.Fault == DeadlockPairs }

// planPairs gives worker slot its pair of keys: the run's two keys in
// order for even slots, reversed for odd ones.
func (r *run) planPairs(slot int, ws *workerSpec) {
	ws.pairs = true
	ws.keys = []string{r.keys[0], r.keys[1]}
	if slot%2 == 1 {
		ws.keys = []string{r.keys[1], r.keys[0]}
	}
}

// pairWaiting returns, for each of the two orders, a worker waiting for
// its second key ("waitpair" line), or nil.
func (r *run) pairWaiting() (even, odd *workerProc) {
	r.mu.Lock()
	ws := append([]*workerProc(nil), r.workers...)
	r.mu.Unlock()
	for _, w := range ws {
		w.mu.Lock()
		waiting := w.state == "waitpair"
		w.mu.Unlock()
		switch {
		case !waiting:
		case w.slot%2 == 0 && even == nil:
			even = w
		case w.slot%2 == 1 && odd == nil:
			odd = w
		}
	}
	return even, odd
}

// stillPairWaiting reports whether w still waits for its second key.
func stillPairWaiting(w *workerProc) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state == "waitpair"
}

// deadlockCycle waits until a cycle closes (two workers of opposite orders
// waiting for their second keys at once), counts it as the cycle's fault,
// and waits until both stopped waiting (at most worker.PairWait and a
// second more), then a moment.
func (r *run) deadlockCycle(ctx context.Context) error {
	deadline := time.Now().Add(triggerTimeout)
	for {
		if a, b := r.pairWaiting(); a != nil && b != nil {
			r.countFault()
			r.logf("cycle closed: %s and %s wait for each other's key", a.proc, b.proc)
			end := time.Now().Add(worker.PairWait + time.Second)
			for (stillPairWaiting(a) || stillPairWaiting(b)) && time.Now().Before(end) {
				if err := sleep(ctx, 20*time.Millisecond); err != nil {
					return err
				}
			}
			return sleep(ctx, 200*time.Millisecond)
		}
		if err := r.checkAlive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no cycle of waits closed within %v", triggerTimeout)
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

// DeadlockSuite is the deadlock scenarios and their controls (make chaos;
// LOCKD_CHAOS_SUITE=deadlock): each control runs until caught, about
// worker.PairWait, which keeps them out of the short suite `make test`
// runs.
func DeadlockSuite() []Spec {
	return []Spec{
		{Name: "deadlock-etcd", Backend: Etcd, Fault: DeadlockPairs, Cycles: 3},
		{Name: "deadlock-pg", Backend: PG, Fault: DeadlockPairs, Cycles: 3},
		{Name: "control-deadlock-off-etcd", Backend: Etcd, Fault: DeadlockPairs, Control: DeadlockOff},
		{Name: "control-deadlock-off-pg", Backend: PG, Fault: DeadlockPairs, Control: DeadlockOff},
	}
}
