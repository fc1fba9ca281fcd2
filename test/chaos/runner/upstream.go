package runner

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/Shopify/toxiproxy/v2/toxics"

	"lock.dev/lockd/test/chaos/worker"
)

// UpstreamHold is the fault of the receive-time control (Control
// ReceiveTTL): a grant whose reply reaches its worker long after lockd last
// heard from the worker's session, made on purpose. Worker 0 reaches lockd
// through a proxy whose upstream direction the harness can hold (gate):
// what worker 0 sends then waits in the proxy, while lockd's replies still
// reach it. The scenario has one key. One cycle:
//
//  1. a rival's hold line is left unanswered (it keeps the key) until
//     lockd's queue for the key, read with Inspect, has worker 0's session
//     first (the session its wait line names);
//  2. the proxy holds worker 0's upstream: lockd hears nothing more from
//     the session, not even its heartbeats;
//  3. upstreamLead later the rival is let go: it releases, lockd grants the
//     key to worker 0 and the reply reaches it, upstreamLead after lockd
//     last heard from the session at the least;
//  4. worker 0's hold line is left unanswered (it keeps trusting the key,
//     if its trust rule lets it) until another worker reports a grant of
//     the key: lockd, hearing nothing, closes worker 0's session a TTL
//     after the last request it received and hands the key to the next
//     waiter (every rival waits for the one key);
//  5. both hold lines are answered, the proxy lets the held bytes go.
//
// A worker that trusts a grant for a TTL from the reply's receipt
// (worker.TrustReceiveTTL) still trusts in step 4: a trusted overlap
// check.NoTrustedOverlap must report. The correct SDK counts from the send
// of its last answered request (C2 #ct2-deadline) and has stopped trusting
// before lockd could close the session (Spec.BreakOff shows it).
//
// The two wall-clock bounds, derived from the TTL: worker 0's SDK must
// apply the grant before its own deadline, which is at least
// minRemaining − margin − upstreamHeartbeat after the hold began (its last
// answered heartbeat is at most one interval older); and the next waiter
// must be granted before worker 0's receive-time trust ends, a TTL after
// the grant's receipt, which is upstreamLead or more after lockd's close (a
// TTL after the hold began at the latest). upstreamLead splits the
// difference: at upstreamTTL (5 s) and lockd's 0.5 s margin each step has
// 1.27 s for what takes milliseconds idle (a release, a grant, a reply on
// loopback: 28 ms measured beside a CPU burner), so they hold on a loaded
// two-core machine. A grant that misses the first bound shows as worker
// 0's acquire failing; the cycle says so and the control runs another.
const UpstreamHold Fault = "upstream-hold"

const (
	// upstreamTTL is the session TTL of the UpstreamHold scenarios: at 3 s
	// etcd's least Remaining left the first bound 50 ms of room.
	upstreamTTL = 5 * time.Second
	// upstreamHeartbeat is worker 0's heartbeat interval: short, so that
	// its last answered heartbeat is recent when the hold begins.
	upstreamHeartbeat = 200 * time.Millisecond
	// firstWait bounds the wait for worker 0's session to show in the
	// queue once a rival holds.
	firstWait = 3 * time.Second
)

// upstreamLead is how long after holding worker 0's upstream the rival is
// let go (see UpstreamHold).
func (r *run) upstreamLead() time.Duration {
	return (minRemaining(r.opts.TTL) - r.opts.Margin - upstreamHeartbeat) / 2
}

// minRemaining is the least Remaining a heartbeat's answer may carry at
// session TTL ttl. PostgreSQL answers the full TTL from the heartbeat's
// receipt; etcd the time its lease has left, and lockd renews the leases
// every TTL/3 on a 100 ms grid (store/etcdstore, keepaliveInterval), so as
// little as two thirds of the TTL less the grid.
func minRemaining(ttl time.Duration) time.Duration { return ttl - ttl/3 - 100*time.Millisecond }

// startGate starts worker 0's gated link to lockd (UpstreamHold only).
func (r *run) startGate() error {
	if r.spec.Fault != UpstreamHold {
		return nil
	}
	registerFar.Do(func() { toxics.Register("chaos_far", new(farToxic)) })
	link := r.spec.Name + "-gate"
	px, err := newProxy(link, r.lockds[0].Addr())
	if err != nil {
		return err
	}
	js := fmt.Sprintf(`{"name":"gate_upstream","type":"chaos_far","stream":"upstream","toxicity":1,`+
		`"attributes":{"link":%q,"latency":0,"observe":""}}`, link)
	if _, err := px.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		px.close()
		return fmt.Errorf("proxy %s: add toxic: %w", px.name, err)
	}
	r.gate = &farLink{name: link, px: px, act: activityOf(link)}
	return nil
}

// planUpstream sets up worker 0 of UpstreamHold: through the gate, a short
// heartbeat interval, and (unless the break is off) the receive-time trust
// rule.
func (r *run) planUpstream(ws *workerSpec) {
	ws.lockd = []string{r.gate.px.addr()}
	ws.heartbeatInterval = upstreamHeartbeat
	if r.spec.breaks(ReceiveTTL) {
		ws.trust = worker.TrustReceiveTTL
	}
}

// upstreamHold is one UpstreamHold cycle (see there).
func (r *run) upstreamHold(ctx context.Context) error {
	r.mu.Lock()
	w0 := r.workers[0]
	r.mu.Unlock()
	key := r.keys[0]
	rivals := func(w *workerProc) bool { return w.slot != 0 }

	// 1. A rival keeps the key while worker 0 is first in its queue.
	var rival *workerProc
	for end := time.Now().Add(triggerTimeout); rival == nil; {
		if time.Now().After(end) {
			return fmt.Errorf("upstream-hold: %s was not first in the queue of %q behind a rival's grant within %v",
				w0.proc, key, triggerTimeout)
		}
		rv, err := r.onNext(ctx, "hold", rivals, func(w *workerProc) { w.withholdAck() })
		if err != nil {
			return err
		}
		first, err := r.firstWaiter(ctx, key, w0)
		if err != nil {
			rv.answerHold()
			return err
		}
		if first {
			rival = rv
			break
		}
		rv.answerHold() // the queue moves on; the next grant may find worker 0 first
	}

	// 2. Hold worker 0's upstream.
	start := r.clock.Now()
	r.gate.act.hold()
	defer r.gate.act.release()
	r.countFault()
	lead := r.upstreamLead()
	r.logf("holding %s's upstream; %s keeps %q, %s first in its queue; the rival goes in %v",
		w0.proc, rival.proc, key, w0.proc, lead)
	if err := sleep(ctx, lead); err != nil {
		rival.answerHold()
		return err
	}

	// 3. Let the rival go; worker 0's grant reply arrives, its hold line
	// is kept.
	tr := &trigger{on: "hold", fired: make(chan *workerProc, 1), action: func(w *workerProc) { w.withholdAck() }}
	w0.trig.Store(tr)
	defer w0.trig.CompareAndSwap(tr, nil)
	frees := w0.frees.Load()
	rival.answerHold()
	granted := false
	for end := time.Now().Add(triggerTimeout); !granted; {
		select {
		case <-tr.fired:
			granted = true
			continue
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond): // polling worker 0's free lines, not synchronising with it
		}
		if w0.frees.Load() > frees {
			// Its acquire ended without a grant: the SDK's own deadline
			// came first (the bound above was overrun).
			r.gate.act.release()
			r.faultWindow(start)
			r.logf("upstream-hold: %s's acquire ended without a grant (its SDK's session ended first): window missed", w0.proc)
			return sleep(ctx, r.opts.TTL/2)
		}
		if time.Now().After(end) {
			return fmt.Errorf("upstream-hold: %s reported neither a grant of %q nor its end within %v of the rival's release",
				w0.proc, key, triggerTimeout)
		}
	}
	defer w0.answerHold() // on an error below; a no-op once answered
	r.logf("%s granted %q %v after its upstream was held", w0.proc, key, time.Duration(r.clock.Now()-start).Round(time.Millisecond))

	// 4. Until lockd hands the key on.
	next, err := r.onNext(ctx, "hold", rivals, func(w *workerProc) { w.withholdAck() })
	if err != nil {
		return fmt.Errorf("upstream-hold: %q not granted to another worker while %s's upstream was held: %w", key, w0.proc, err)
	}
	r.logf("%q granted to %s %v after %s's upstream was held, %s still holding it", key, next.proc,
		time.Duration(r.clock.Now()-start).Round(time.Millisecond), w0.proc, w0.proc)

	// 5. Answer both, let the held bytes go.
	next.answerHold()
	w0.answerHold()
	r.gate.act.release()
	r.faultWindow(start)
	return sleep(ctx, r.opts.TTL/2)
}

// firstWaiter polls lockd's queue of key, up to firstWait, until w's
// current session (its wait line's) is in it, and reports whether it is
// first.
func (r *run) firstWaiter(ctx context.Context, key string, w *workerProc) (bool, error) {
	c := r.slotClient.Load()
	if c == nil {
		return false, fmt.Errorf("upstream-hold: no lockd client to inspect %q", key)
	}
	for end := time.Now().Add(firstWait); time.Now().Before(end); {
		if sid := w.waitingIn(); sid != "" {
			ictx, cancel := context.WithTimeout(ctx, time.Second)
			info, err := c.Inspect(ictx, key)
			cancel()
			if err == nil {
				if i := slices.Index(info.Waiters, sid); i >= 0 {
					return i == 0, nil
				}
			}
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return false, err
		}
	}
	return false, nil
}
