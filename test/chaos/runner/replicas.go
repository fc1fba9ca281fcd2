package runner

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// The replica faults of issue 13: three lockd replicas over one backend,
// the workers spread over them (each dials all three, pick-first, starting
// from a different one), and sessions that must survive the replica they
// talk to.
const (
	// ReplicaKill SIGKILLs, while a worker holds a key, the replica that
	// worker's grant came through (the address on its "hold" line), and
	// restarts it a TTL later. The holder's SDK moves to another replica,
	// which adopts the session and keeps it alive; the hold spans the kill,
	// so its trust is kept by heartbeats through the new replica.
	ReplicaKill Fault = "replica-kill"
	// RollingRestart restarts the three replicas one at a time under load:
	// SIGTERM (graceful drain, C2 #ct2-drain), wait for the exit, start it
	// again on the same address, wait until it serves, then the next.
	RollingRestart Fault = "rolling-restart"
)

// replicaTTL is the session TTL of the real replica scenarios. A session
// survives the death of its replica when its client gets a heartbeat
// answered through another before its deadline: at the shortest TTL (2 s,
// 0.5 s margin) that budget is under a second after a kill late in the
// heartbeat cycle, which the move (a new connection, the adoption's reads)
// overran once on a loaded two-core machine (a grant lost, no safety
// violation). 5 s leaves about three seconds, still well below lockd's
// default of 15 s.
const replicaTTL = 5 * time.Second

// StaleRecord runs ReplicaKill on lockd binaries built with the server's
// test-only tag lockd_stale_control (server/liveness_stale.go): a replica
// answers every heartbeat of a session it adopted after the first from the
// record it read then — live, the same Remaining, the same held set —
// without asking the backend, which therefore lets the session expire while
// the client keeps trusting. The holder whose replica was killed keeps its
// key until the backend has granted it to another worker (staleOverlap), so
// every cycle makes the overlap check.NoTrustedOverlap must find. At
// replicaTTL, as replica-kill: the holder's move must be answered before
// its trust runs out.
const StaleRecord Control = "stale-record"

// replicaFault reports whether the scenario runs three replicas for an
// issue 13 fault.
func (r *run) replicaFault() bool {
	return r.spec.Fault == ReplicaKill || r.spec.Fault == RollingRestart
}

// keepsSessions reports whether every grant of the scenario must end by its
// release: a real replica scenario, where no session may be lost.
func (s Spec) keepsSessions() bool {
	return s.judgedReal() && (s.Fault == ReplicaKill || s.Fault == RollingRestart)
}

// replicaHolds bounds the holds of the replica faults: some shorter than a
// heartbeat interval, some past the TTL, so that trust across the move is
// kept by heartbeats through the new replica. The StaleRecord control's
// holder keeps its key past the move for as long as the control needs
// (staleOverlap), not for a hold drawn from these bounds.
func (r *run) replicaHolds() (lo, hi time.Duration) {
	return 300 * time.Millisecond, r.opts.TTL * 3 / 2
}

// lockdAt returns the replica listening on addr, nil if none.
func (r *run) lockdAt(addr string) *lockdProc {
	for _, l := range r.lockds {
		if l.Addr() == addr {
			return l
		}
	}
	return nil
}

// cycle13 runs a cycle of the replica faults; handled is false for another
// fault.
func (r *run) cycle13(ctx context.Context) (handled bool, err error) {
	switch r.spec.Fault {
	case ReplicaKill:
		return true, r.replicaKill(ctx)
	case RollingRestart:
		return true, r.rollingRestart(ctx)
	}
	return false, nil
}

// replicaKill is one ReplicaKill cycle. Under the StaleRecord control the
// holder keeps its key (its hold line unanswered) until another worker has
// been granted that key (staleOverlap).
func (r *run) replicaKill(ctx context.Context) error {
	ttl := r.opts.TTL
	var (
		start  int64
		victim *lockdProc
		key    string
	)
	known := func(w *workerProc) bool { return r.lockdAt(w.replica()) != nil }
	w, err := r.onNext(ctx, "hold", known, func(w *workerProc) {
		if l := r.lockdAt(w.replica()); l != nil && !l.proc().done() {
			victim, start = l, r.clock.Now()
			l.proc().signal(syscall.SIGKILL)
			if r.spec.Control == StaleRecord {
				w.withholdAck()
				w.mu.Lock()
				key = w.key
				w.mu.Unlock()
			}
		}
	})
	if err != nil {
		return err
	}
	defer w.answerHold() // a no-op unless the hold was kept
	if victim == nil {
		return fmt.Errorf("replica of %s (%q) not found or not running", w.proc, w.replica())
	}
	victim.down()
	r.countFault()
	r.logf("killed replica %s (%s) while %s holds through it", victim.cfg.name, victim.Addr(), w.proc)
	if err := sleep(ctx, ttl); err != nil {
		return err
	}
	if err := victim.restart(); err != nil {
		return err
	}
	r.faultWindow(start)
	if r.spec.Control == StaleRecord {
		if err := r.staleOverlap(ctx, w, key, start); err != nil {
			return err
		}
		w.answerHold() // now, not after the sleep below: the waiters for the key are judged from the restart
	}
	return sleep(ctx, ttl)
}

// staleOverlap is the StaleRecord control's wait: w, whose replica was
// killed at run time since while it held key, keeps holding (its hold line
// unanswered, its SDK trusting the stale record's answers) until another
// worker reports a grant of key — the backend, which nothing told of the
// session, let it expire and handed the key on — and is let go only then,
// so that every cycle has a trusted overlap for check.NoTrustedOverlap to
// find, however long the move and the expiry take. Holds alone (3–4 TTLs)
// once ended before the key was granted again in all 3 cycles of a CI run.
//
// With the break off (Spec.BreakOff: the real lockd, whose replicas keep
// an adopted session alive in the backend) the key is never granted to
// another while w holds it; w is kept for staleOff and let go then.
func (r *run) staleOverlap(ctx context.Context, w *workerProc, key string, since int64) error {
	limit := triggerTimeout
	if r.spec.BreakOff {
		limit = staleOff(r.opts.TTL)
	}
	for end := time.Now().Add(limit); ; {
		r.mu.Lock()
		granted := r.lastHold[key] > since
		r.mu.Unlock()
		if granted {
			r.logf("control: %s granted to another worker while %s still holds it", key, w.proc)
			return nil
		}
		if err := r.checkAlive(); err != nil {
			return err
		}
		if r.spec.BreakOff && time.Now().After(end) {
			r.logf("control (break off): %s kept by %s for %v after the replica's restart, never granted to another", key, w.proc, limit)
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("control: %s not granted to another worker within %v of the replica's restart while %s held it",
				key, triggerTimeout, w.proc)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// staleOff is how long staleOverlap keeps the holder with the break off:
// a TTL after the replica's restart, two after the kill, twice as long as
// the backend takes to expire the session when the stale replica lets it
// (the break's runs hand the key on about a TTL after the kill), and inside
// the recovery bound (TTL + reaper + slack after the restart), which the
// waiters for the key are judged by once it is let go.
func staleOff(ttl time.Duration) time.Duration { return ttl }

// rollingRestart is one RollingRestart cycle: every replica in turn.
func (r *run) rollingRestart(ctx context.Context) error {
	start := r.clock.Now()
	for _, l := range r.lockds {
		t0 := time.Now()
		if err := l.stop(); err != nil {
			return err
		}
		l.holdAddr()
		if err := l.restart(); err != nil {
			return err
		}
		r.countFault()
		r.logf("restarted replica %s (SIGTERM to serving again: %v)", l.cfg.name, time.Since(t0).Round(time.Millisecond))
		if err := sleep(ctx, r.opts.TTL/2); err != nil {
			return err
		}
	}
	r.faultWindow(start)
	return sleep(ctx, r.opts.TTL)
}
