package runner

import (
	"context"
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
func (r *run) noHeal(ctx context.Context, start int64) error {
	r.faultWindow(start)
	r.logf("control: fault recorded as ended, link kept cut for %v", r.livenessBound()+time.Second)
	if err := sleep(ctx, r.livenessBound()+time.Second); err != nil {
		return err
	}
	if err := r.proxy.heal(); err != nil {
		return err
	}
	return sleep(ctx, r.opts.TTL)
}
