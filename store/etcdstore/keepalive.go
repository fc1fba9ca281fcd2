package etcdstore

import (
	"container/heap"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// The keepalive machinery. A keeper owns the leases of a Store's sessions:
// one owner goroutine (keeper.run) decides what to send and interprets
// every answer; one goroutine per stream (runStream, plus its receiver,
// keepalive_stream.go) moves bytes. Why clientv3's Lease.KeepAlive is not
// used: see the package doc.

const (
	// maxKeepaliveInterval caps the time between two keepalives of a lease
	// (TTL/3 otherwise), so that a lease revoked behind lockd's back is
	// noticed within about three seconds whatever the TTL. It is a cost
	// knob, not a safety one: see the package doc ("Keepalive interval").
	maxKeepaliveInterval = 3 * time.Second
	minStreamBackoff     = 20 * time.Millisecond
	maxStreamBackoff     = 500 * time.Millisecond
	// sendTick is the grid keepalive sends are aligned to: a send is due at
	// the first tick after its interval has passed, so the owner wakes at
	// most once a tick and sends what is due together (fewer wake-ups and
	// fewer writes on the stream than one per lease).
	sendTick = 100 * time.Millisecond
	// probeRetry is the pause before probing again a lease that exists but
	// has under a second left.
	probeRetry = 100 * time.Millisecond
)

// keepaliveInterval is the time from one keepalive send of a lease to the
// next (when the previous one has been answered by then).
func keepaliveInterval(ttl time.Duration) time.Duration { return min(ttl/3, maxKeepaliveInterval) }

// overdueAfter is how long an answer may take before the stream is
// considered stuck and replaced.
func overdueAfter(ttl time.Duration) time.Duration { return ttl / 3 }

// probeTimeout bounds one TimeToLive probe of a lease whose bound ran out.
func probeTimeout(ttl time.Duration) time.Duration { return max(ttl/3, 500*time.Millisecond) }

// keeper keeps the leases of a Store's sessions alive over one
// LeaseKeepAlive stream and holds each lease's proven bound (see the
// package doc, "Keepalive and the deadline bound").
//
// Locking: mu guards leases, due and every session's ka; it is a leaf
// lock. The Store may call keeper methods while holding Store.mu; the
// keeper never takes Store.mu while holding mu, and calls lost and prune
// with mu released.
type keeper struct {
	cli    *clientv3.Client // TimeToLive probes
	lc     pb.LeaseClient   // the LeaseKeepAlive streams
	ctx    context.Context  // the Store's: cancelled by Close
	wg     sync.WaitGroup   // the owner, the streams and the probes
	epoch  time.Time        // origin of the send grid
	wake   chan struct{}    // pokes the owner; capacity 1
	events chan kaEvent     // streams → owner

	// lost is told, with mu released, that a lease is gone
	// (LostLeaseExpired) or can no longer be shown alive
	// (LostKeepaliveFailed): the session is dead.
	lost func(ss *session, reason string)
	// prune is called by the owner about once a minute, with mu released,
	// to forget sessions dead for longer than deadRetention.
	prune func(now time.Time)
	// idle is told, with mu released, that the owner stopped keeping an
	// adopted session no call used for a TTL (Store.dropIdle).
	idle func(ss *session)
	// beforeSend, set by tests before the first lease is kept, runs on the
	// stream's goroutine before each keepalive request is written.
	beforeSend func(lease clientv3.LeaseID)

	mu     sync.Mutex
	leases map[clientv3.LeaseID]*session // the sessions whose leases are kept
	due    dueHeap                       // sessions by when the owner next looks at them
}

// kaState is the keepalive state of a session's lease, guarded by
// keeper.mu and driven by the owner: at most one keepalive in flight, sent
// on stream sentGen at sentAt.
type kaState struct {
	// expiry is the proven lower bound of the lease's end on the monotonic
	// clock: send time of the last answered keepalive (or grant, or probe)
	// plus the TTL in its answer. It only ever grows.
	expiry    time.Time
	inflight  bool
	sentAt    time.Time
	sentGen   uint64
	nextSend  time.Time
	probing   bool
	nextProbe time.Time
	dueAt     time.Time // when the owner next looks at it
	dueIdx    int       // 1 + index in keeper.due; 0 when not in it
	// adopted sessions (record.go) are kept only while used: lastUse is
	// the start of the latest call through this Store, busy counts calls
	// in progress that may last (Acquire). Kept while busy > 0 or
	// lastUse + TTL has not passed: any trust granted through this Store
	// counts from a call's receipt and is at most the TTL.
	adopted bool
	lastUse time.Time
	busy    int
	// first, for an adopted session, is closed once the keepalive sent at
	// adoption is answered or void (its stream gone, the session no longer
	// kept): a Heartbeat without a bound yet waits for it (firstAnswer).
	first chan struct{}
}

// settleFirstLocked closes ka.first, if open (keeper.mu held).
func (ka *kaState) settleFirstLocked() {
	if ka.first != nil {
		close(ka.first)
		ka.first = nil
	}
}

func newKeeper(ctx context.Context, cli *clientv3.Client, lost func(*session, string), prune func(time.Time), idle func(*session)) *keeper {
	return &keeper{
		cli:    cli,
		lc:     pb.NewLeaseClient(cli.ActiveConnection()),
		ctx:    ctx,
		epoch:  time.Now(),
		wake:   make(chan struct{}, 1),
		events: make(chan kaEvent, 64),
		lost:   lost,
		prune:  prune,
		idle:   idle,
		leases: make(map[clientv3.LeaseID]*session),
	}
}

// start starts the owner goroutine; it returns when ctx is cancelled, and
// wait waits for it and everything it started.
func (k *keeper) start() {
	k.wg.Add(1)
	go k.run() // exits when Close cancels k.ctx
}

func (k *keeper) wait() { k.wg.Wait() }

// add starts keeping ss's lease, granted by a request sent at sent: etcd
// starts the lease when it applies the grant, after sent.
func (k *keeper) add(ss *session, sent time.Time) {
	k.mu.Lock()
	ss.ka.expiry = sent.Add(ss.ttl)
	ss.ka.nextSend = k.nextSendAfter(sent, ss.ttl)
	k.leases[ss.lease] = ss
	k.scheduleLocked(ss, time.Now())
	k.mu.Unlock()
	k.poke()
}

// adopt starts keeping the lease of ss, a session opened elsewhere: its
// bound is unknown until the first keepalive (sent at once) or probe is
// answered, so Remaining is 0 until then.
func (k *keeper) adopt(ss *session, now time.Time) {
	k.mu.Lock()
	ss.ka.adopted, ss.ka.lastUse = true, now
	ss.ka.first = make(chan struct{})
	ss.ka.nextSend = now
	ss.ka.nextProbe = now.Add(overdueAfter(ss.ttl))
	k.leases[ss.lease] = ss
	k.scheduleLocked(ss, now)
	k.mu.Unlock()
	k.poke()
}

// touch records a call for ss starting at now.
func (k *keeper) touch(ss *session, now time.Time) {
	k.mu.Lock()
	if now.After(ss.ka.lastUse) {
		ss.ka.lastUse = now
	}
	k.mu.Unlock()
}

// use marks a lasting call for ss (Acquire) in progress until the returned
// function is called.
func (k *keeper) use(ss *session) func() {
	k.mu.Lock()
	ss.ka.busy++
	k.mu.Unlock()
	return func() {
		k.mu.Lock()
		ss.ka.busy--
		ss.ka.lastUse = latest(ss.ka.lastUse, time.Now())
		k.mu.Unlock()
	}
}

// remove stops keeping ss's lease (the session is dead). Idempotent.
func (k *keeper) remove(ss *session) {
	k.mu.Lock()
	if k.leases[ss.lease] == ss {
		delete(k.leases, ss.lease)
	}
	ss.ka.settleFirstLocked()
	k.mu.Unlock()
}

// firstAnswer returns a channel closed once the keepalive that ss's
// adoption sent is answered or void, nil when there is none to wait for
// (not adopted, or settled already).
func (k *keeper) firstAnswer(ss *session) <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ss.ka.first == nil {
		return nil
	}
	return ss.ka.first
}

// extend raises ss's bound to until if that is later.
func (k *keeper) extend(ss *session, until time.Time) {
	k.mu.Lock()
	ss.ka.extendLocked(until)
	k.mu.Unlock()
}

// remaining is ss's bound measured from now, at most the TTL.
func (k *keeper) remaining(ss *session, now time.Time) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	return min(ss.ka.expiry.Sub(now), ss.ttl)
}

func (ka *kaState) extendLocked(until time.Time) {
	if until.After(ka.expiry) {
		ka.expiry = until
	}
}

// poke wakes the owner (a lease was added or a probe ended).
func (k *keeper) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// death is a lease the owner or a probe found dead, reported to lost once
// mu is released.
type death struct {
	ss     *session
	reason string
}

// run is the owner: it owns the keepalive stream and every lease's
// keepalive state. Per lease: at most one keepalive in flight, the next one
// keepaliveInterval after the previous send; an answer overdue by TTL/3
// tears the stream down (its requests are void) and a new one is opened
// with backoff. When a session's proven bound runs out, one TimeToLive
// probe decides its fate. Sessions wait in k.due, ordered by when they next
// need attention, so a wake-up costs what is due, not a pass over every
// session; only a stream change (torn down, opened) looks at all of them.
// It returns when Close cancels k.ctx.
func (k *keeper) run() {
	defer k.wg.Done()
	var (
		cur       *kaStream
		gen       uint64
		backoff   = minStreamBackoff
		retryAt   time.Time
		rescan    bool // the stream changed: every session needs a look
		lastPrune = time.Now()
		due       []*session
		dead      []death
		idle      []*session
	)
	defer func() {
		if cur != nil {
			cur.cancel()
		}
	}()
	teardown := func(now time.Time) {
		cur.cancel()
		cur = nil
		rescan = true
		retryAt = now.Add(time.Duration(float64(backoff) * (0.8 + 0.4*rand.Float64())))
		backoff = min(2*backoff, maxStreamBackoff)
	}
	// handleLocked interprets one event; a lease found gone is appended to
	// dead.
	handleLocked := func(ev kaEvent) {
		if cur == nil || ev.gen != cur.gen {
			return // from a stream already torn down: void
		}
		if ev.err != nil {
			teardown(time.Now())
			return
		}
		backoff = minStreamBackoff
		ss := k.leases[clientv3.LeaseID(ev.resp.ID)]
		if ss == nil || !ss.ka.inflight || ss.ka.sentGen != ev.gen {
			return
		}
		ss.ka.inflight = false
		ss.ka.settleFirstLocked()
		if ev.resp.TTL <= 0 {
			delete(k.leases, ss.lease)
			dead = append(dead, death{ss, telemetry.LostLeaseExpired})
			return
		}
		// Sent at sentAt, renewed by etcd on receipt (later): the lease
		// lives at least until sentAt + TTL.
		ss.ka.extendLocked(ss.ka.sentAt.Add(time.Duration(ev.resp.TTL) * time.Second))
		k.scheduleLocked(ss, ss.ka.nextSend) // a late answer: nextSend is past, so at once
	}
	// step does what is due for one session and returns when it next needs
	// attention (zero: only a probe's end or a stream change will tell),
	// and whether its keepalive answer is overdue.
	step := func(ss *session, now time.Time) (next time.Time, overdue bool) {
		ka := &ss.ka
		if ka.inflight && (cur == nil || ka.sentGen != gen) {
			ka.inflight = false // its stream is gone: void, resend at once
			ka.nextSend = now
			ka.settleFirstLocked() // a Heartbeat waiting for it probes instead
		}
		switch {
		case ka.inflight:
			if at := ka.sentAt.Add(overdueAfter(ss.ttl)); now.Before(at) {
				next = at
			} else {
				overdue = true
			}
		case cur == nil:
		case now.Before(ka.nextSend):
			next = ka.nextSend
		case ka.adopted && ka.busy == 0 && now.Sub(ka.lastUse) > ss.ttl:
			// Adopted and unused for a TTL: stop keeping it.
			delete(k.leases, ss.lease)
			ka.settleFirstLocked()
			idle = append(idle, ss)
			return time.Time{}, false
		default:
			ka.inflight, ka.sentAt, ka.sentGen = true, now, gen
			ka.nextSend = k.nextSendAfter(now, ss.ttl)
			cur.enqueue(ss.lease)
			for _, c := range ss.companions {
				cur.enqueue(c) // lock-delay companions (delay.go); their answers are ignored
			}
			next = ka.nextSend
		}
		if !ka.probing {
			if at := latest(ka.expiry, ka.nextProbe); now.Before(at) {
				if next.IsZero() || at.Before(next) {
					next = at
				}
			} else {
				ka.probing = true
				k.wg.Add(1)
				go k.probe(ss) // one TimeToLive, bounded by probeTimeout; schedules ss again
			}
		}
		return next, overdue
	}
	// report tells lost about the leases found dead, with mu released.
	report := func() {
		for i, d := range dead {
			k.lost(d.ss, d.reason)
			dead[i] = death{}
		}
		dead = dead[:0]
	}

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		next := now.Add(time.Hour)
		overdue := false
		k.mu.Lock()
		if cur == nil && len(k.leases) > 0 && !now.Before(retryAt) {
			gen++
			cur = k.startStream(gen)
			rescan = true
		}
		if rescan {
			rescan = false
			for _, ss := range k.leases {
				k.scheduleLocked(ss, now)
			}
		}
		// Take what is due first, then schedule it again: a session
		// rescheduled at once (overdue) must not be taken twice.
		due = due[:0]
		for len(k.due) > 0 && !k.due[0].ka.dueAt.After(now) {
			due = append(due, heap.Pop(&k.due).(*session))
		}
		for _, ss := range due {
			if k.leases[ss.lease] != ss {
				continue // dead meanwhile
			}
			at, od := step(ss, now)
			overdue = overdue || od
			if !at.IsZero() {
				k.scheduleLocked(ss, at)
			}
		}
		clear(due)
		idled := idle
		idle = nil
		if len(k.due) > 0 {
			next = earliest(next, k.due[0].ka.dueAt)
		}
		if cur == nil && len(k.leases) > 0 {
			next = earliest(next, retryAt)
		}
		k.mu.Unlock()
		for _, ss := range idled {
			k.idle(ss)
		}
		if now.Sub(lastPrune) > time.Minute {
			lastPrune = now
			k.prune(now)
		}
		if overdue && cur != nil {
			teardown(now)
			continue
		}

		timer.Reset(next.Sub(now))
		select {
		case <-k.ctx.Done():
			return
		case <-k.wake:
		case <-timer.C:
		case ev := <-k.events:
			k.mu.Lock()
			handleLocked(ev)
		drain:
			for {
				select {
				case ev := <-k.events:
					handleLocked(ev)
				default:
					break drain
				}
			}
			k.mu.Unlock()
			report()
		}
	}
}

// probe asks etcd once about a lease whose proven bound ran out. A TTL
// gives a fresh bound (probe send time + TTL); a missing lease is death by
// expiry; no answer at all is death by keepalive failure, unless a
// keepalive answer extended the bound meanwhile.
func (k *keeper) probe(ss *session) {
	defer k.wg.Done()
	ctx, cancel := context.WithTimeout(k.ctx, probeTimeout(ss.ttl))
	sent := time.Now()
	resp, err := k.cli.TimeToLive(ctx, ss.lease)
	cancel()
	reason := ""
	defer func() {
		if reason != "" {
			k.lost(ss, reason)
		}
	}()
	defer k.poke()
	k.mu.Lock()
	defer k.mu.Unlock()
	ss.ka.probing = false
	if k.leases[ss.lease] != ss || k.ctx.Err() != nil {
		return // dead meanwhile, or the Store closed
	}
	now := time.Now()
	k.scheduleLocked(ss, now) // the owner decides what comes next
	switch {
	case err == nil && resp.TTL > 0:
		ss.ka.extendLocked(sent.Add(time.Duration(resp.TTL) * time.Second))
	case err == nil && resp.TTL < 0, errors.Is(classify(context.Background(), err), store.ErrSessionDead):
		reason = telemetry.LostLeaseExpired
	case now.Before(ss.ka.expiry):
		// A keepalive answer arrived while probing.
	case err == nil:
		ss.ka.nextProbe = now.Add(probeRetry) // exists, under a second left
	default:
		reason = telemetry.LostKeepaliveFailed
	}
	if reason != "" {
		delete(k.leases, ss.lease)
		ss.ka.settleFirstLocked()
	}
}
