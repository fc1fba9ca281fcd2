package runner

import (
	"context"
	"time"
)

// ReplicaSwitch runs two lockd replicas on one backend, with workers whose
// first replica is replica 0 reaching it through a proxy in front of it.
// While such a worker holds a key, the proxy drops every connection to
// replica 0 and refuses new ones (see drop) for two TTLs; replica 0 keeps its
// link to the backend. The worker's SDK moves to replica 1 (issue 11 §3):
// replica 1 adopts the session and keeps it alive (PostgreSQL since issue
// 11, etcd since issue 13's session record), and replica 0's silence close
// must not free the keys while it does (it ends only a session no other
// replica keeps). No trusted overlap.
const ReplicaSwitch Fault = "replica-switch"

// switchHolds bounds the holds of ReplicaSwitch: longer than the TTL, so
// that the hold during which the connection drops spans replica 0's
// silence close (about a TTL later) and trust is kept by heartbeats
// through replica 1 meanwhile.
func switchHolds(ttl time.Duration) (lo, hi time.Duration) { return ttl * 3 / 2, 2 * ttl }

// drop cuts the proxy's clients off: it stops the proxy, which closes every
// connection through it and refuses new ones until heal listens afresh on
// the same address. (Not a reset_peer toxic: in toxiproxy v2.12.0 a link
// whose reset_peer stage closed leaves the stage before it blocked on a
// channel nobody reads, one goroutine leaked per connection, which the
// suite's leak check fails on.)
func (px *proxy) drop() {
	px.mu.Lock()
	defer px.mu.Unlock()
	px.p.Stop()
	px.cut = true
}

// startFront puts a proxy in front of replica 0 for ReplicaSwitch.
func (r *run) startFront() error {
	if r.spec.Fault != ReplicaSwitch {
		return nil
	}
	var err error
	r.front, err = newProxy(r.spec.Name+"-front", r.lockds[0].Addr())
	return err
}

// clientAddrs are the lockd addresses workers dial: replica 0 through the
// front proxy when there is one.
func (r *run) clientAddrs() []string {
	addrs := r.lockdAddrs()
	if r.front != nil {
		addrs[0] = r.front.addr()
	}
	return addrs
}

// replicaSwitch is one ReplicaSwitch cycle.
func (r *run) replicaSwitch(ctx context.Context) error {
	ttl := r.opts.TTL
	var start int64
	w, err := r.onNext(ctx, "hold", func(w *workerProc) bool { return w.slot%2 == 0 },
		func(*workerProc) { start = r.clock.Now(); r.front.drop() })
	if err != nil {
		return err
	}
	r.countFault()
	r.logf("dropped every client connection to %s while %s holds, for %v", r.lockds[0].cfg.name, w.proc, 2*ttl)
	if err := sleep(ctx, 2*ttl); err != nil {
		return err
	}
	if err := r.front.heal(); err != nil {
		return err
	}
	r.faultWindow(start)
	return sleep(ctx, time.Duration(float64(ttl)*1.5))
}
