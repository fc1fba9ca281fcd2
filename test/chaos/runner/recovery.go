package runner

import (
	"context"
	"fmt"
	"time"

	"lock.dev/lockd/test/chaos/check"
)

// faultWindow records that a fault which began at run time start has just
// ended (check.Recovery measures every key's next grant from here).
func (r *run) faultWindow(start int64) {
	end := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.windows = append(r.windows, check.Window{Fault: string(r.spec.Fault), Start: start, End: end})
}

// sawHold records a grant reported by a worker.
func (r *run) sawHold(key string) {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastHold[key] = now
}

// livenessBound is the bound of both liveness checkers: TTL + the backend's
// expiry interval + slack.
func (r *run) livenessBound() time.Duration {
	return check.LivenessBound(r.opts.TTL, r.reaperBound(), r.opts.LivenessSlack)
}

// awaitRegrants keeps the workers running after the last fault until every
// key has been granted again, or the recovery bound (and a second) has run
// out, so that check.Recovery can decide on the last fault.
func (r *run) awaitRegrants(ctx context.Context) error {
	r.mu.Lock()
	var end int64
	if n := len(r.windows); n > 0 {
		end = r.windows[n-1].End
	}
	r.mu.Unlock()
	deadline := end + int64(r.livenessBound()+time.Second)
	for r.clock.Now() < deadline {
		r.mu.Lock()
		all := true
		for _, k := range r.keys {
			all = all && r.lastHold[k] > end
		}
		r.mu.Unlock()
		if all {
			return nil
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// noHeal is the NoHeal control's end of a partition: the fault is recorded
// as ended now, but the cut stays for the recovery bound and a second more,
// so no key can be granted again within the bound of the recorded end, and
// check.Recovery must say so. Then it heals for real.
//
// check.Recovery measures a key's delay from the fault's end only when an
// acquire of it (or a session open made to acquire it) is in flight then
// (else from the first one invoked later), so the end is recorded only once
// a worker is seen waiting in an acquire: lockd, cut from PostgreSQL, cannot
// grant it until the link heals, past the bound (a grant made before the
// cut would have been reported, its hold line, in the half TTL the cut
// lasts before this). Its session outlives the whole cut
// (noHealSessionTTL), so that acquire stays in flight, or is retried, until
// then. With lockd's TTL every session could die before the recorded end
// (a CI run once found no key wanted between the end and the heal, and the
// acquires after the heal granted at once). The waiter need not have
// started waiting during the cut: every worker may be waiting from before
// it, and stay so (a run that required a wait line read during the cut
// found none in 45 s).
//
// With the break off (Spec.BreakOff) the link heals as the end is
// recorded, as in partition-short: recovery must then find every key
// granted again in time.
func (r *run) noHeal(ctx context.Context, start int64) error {
	w, err := r.awaitWaiter(ctx)
	if err != nil {
		return err
	}
	if r.spec.BreakOff {
		if err := r.proxy.heal(); err != nil {
			return err
		}
		r.faultWindow(start)
		r.logf("control (break off): healed as the fault's end was recorded, %s waiting in an acquire", w.proc)
		return sleep(ctx, 2*r.opts.TTL)
	}
	r.faultWindow(start)
	r.logf("control: fault recorded as ended while %s waits in an acquire, link kept cut for %v",
		w.proc, r.livenessBound()+time.Second)
	if err := sleep(ctx, r.livenessBound()+time.Second); err != nil {
		return err
	}
	if err := r.proxy.heal(); err != nil {
		return err
	}
	return sleep(ctx, r.opts.TTL)
}

// noHealSessionTTL is the session TTL of the NoHeal control's workers: three
// times the whole cut (the partition, then the bound and a second), so that
// a session the cut finds live is still live when the link heals (its SDK
// trusts it for two thirds of the TTL after its last heartbeat at the
// least, the heartbeat interval being a third of it).
func (r *run) noHealSessionTTL() time.Duration {
	return (3 * (r.opts.TTL/2 + r.livenessBound() + time.Second)).Round(time.Millisecond)
}

// awaitWaiter waits, up to triggerTimeout, until a worker's latest state
// line is "wait": an acquire of it is in flight.
func (r *run) awaitWaiter(ctx context.Context) (*workerProc, error) {
	for end := time.Now().Add(triggerTimeout); ; {
		r.mu.Lock()
		ws := append([]*workerProc(nil), r.workers...)
		r.mu.Unlock()
		for _, w := range ws {
			if !w.p.done() && w.waiting() {
				return w, nil
			}
		}
		if time.Now().After(end) {
			return nil, fmt.Errorf("control: no worker waited in an acquire within %v of the cut's end", triggerTimeout)
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return nil, err
		}
	}
}
