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

// The keepalive machinery. One owner goroutine (keepaliveLoop) decides
// what to send and interprets every answer; one goroutine per stream
// (runStream, plus its receiver) moves bytes. Why clientv3's Lease.KeepAlive
// is not used: see the package doc.

const (
	// maxKeepaliveInterval caps the time between two keepalives of a lease
	// (TTL/3 otherwise), so that a lease revoked behind lockd's back is
	// noticed within about three seconds whatever the TTL. It is a cost
	// knob, not a safety one: see the package doc ("Keepalive interval").
	maxKeepaliveInterval = 3 * time.Second
	minStreamBackoff     = 20 * time.Millisecond
	maxStreamBackoff     = 500 * time.Millisecond
	// deadRetention is how long a dead session is remembered; afterwards
	// it is unknown, which is reported the same way (not live).
	deadRetention = 10 * time.Minute
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

// nextSendAfter is when the keepalive after one sent at sent is due: the
// interval later, rounded up to the Store's sendTick grid. The grid counts
// from s.epoch on the monotonic clock.
func (s *Store) nextSendAfter(sent time.Time, ttl time.Duration) time.Time {
	at := sent.Add(keepaliveInterval(ttl))
	ticks := (at.Sub(s.epoch) + sendTick - 1) / sendTick
	return s.epoch.Add(ticks * sendTick)
}

// overdueAfter is how long an answer may take before the stream is
// considered stuck and replaced.
func overdueAfter(ttl time.Duration) time.Duration { return ttl / 3 }

// kaEvent is what a stream reports to the owner: an answer or the error
// that ended the stream.
type kaEvent struct {
	gen  uint64
	resp *pb.LeaseKeepAliveResponse
	err  error
}

// kaStream is one LeaseKeepAlive stream. Requests queued before the stream
// is open are sent once it is.
type kaStream struct {
	gen    uint64
	cancel context.CancelFunc
	kick   chan struct{} // capacity 1

	mu      sync.Mutex
	pending []int64
}

func (st *kaStream) enqueue(lease clientv3.LeaseID) {
	st.mu.Lock()
	st.pending = append(st.pending, int64(lease))
	st.mu.Unlock()
	select {
	case st.kick <- struct{}{}:
	default:
	}
}

func (st *kaStream) take() []int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	p := st.pending
	st.pending = nil
	return p
}

// poke wakes the keepalive owner (a session was added).
func (s *Store) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// keepaliveLoop owns the keepalive stream and every session's keepalive
// state. Per lease: at most one keepalive in flight, the next one
// keepaliveInterval after the previous send; an answer overdue by TTL/3
// tears the stream down (its requests are void) and a new one is opened with backoff. When a
// session's proven bound runs out, one TimeToLive probe decides its fate.
// Sessions wait in s.due, ordered by when they next need attention, so a
// wake-up costs what is due, not a pass over every session; only a stream
// change (torn down, opened) looks at all of them.
// It returns when Close cancels s.ctx.
func (s *Store) keepaliveLoop() {
	defer s.wg.Done()
	var (
		cur       *kaStream
		gen       uint64
		backoff   = minStreamBackoff
		retryAt   time.Time
		rescan    bool // the stream changed: every session needs a look
		lastPrune = time.Now()
		due       []*session
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
	handle := func(ev kaEvent) {
		if cur == nil || ev.gen != cur.gen {
			return // from a stream already torn down: void
		}
		if ev.err != nil {
			teardown(time.Now())
			return
		}
		backoff = minStreamBackoff
		s.mu.Lock()
		defer s.mu.Unlock()
		ss := s.byLease[clientv3.LeaseID(ev.resp.ID)]
		if ss == nil || !ss.inflight || ss.sentGen != ev.gen {
			return
		}
		ss.inflight = false
		if ev.resp.TTL <= 0 {
			s.markDeadLocked(ss, telemetry.LostLeaseExpired)
			return
		}
		// Sent at sentAt, renewed by etcd on receipt (later): the lease
		// lives at least until sentAt + TTL.
		ss.extendLocked(ss.sentAt.Add(time.Duration(ev.resp.TTL) * time.Second))
		s.scheduleLocked(ss, ss.nextSend) // a late answer: nextSend is past, so at once
	}
	// step does what is due for one session and returns when it next needs
	// attention (zero: only a probe's end or a stream change will tell),
	// and whether its keepalive answer is overdue.
	step := func(ss *session, now time.Time) (next time.Time, overdue bool) {
		if ss.inflight && (cur == nil || ss.sentGen != gen) {
			ss.inflight = false // its stream is gone: void, resend at once
			ss.nextSend = now
		}
		switch {
		case ss.inflight:
			if at := ss.sentAt.Add(overdueAfter(ss.ttl)); now.Before(at) {
				next = at
			} else {
				overdue = true
			}
		case cur == nil:
		case now.Before(ss.nextSend):
			next = ss.nextSend
		default:
			ss.inflight, ss.sentAt, ss.sentGen = true, now, gen
			ss.nextSend = s.nextSendAfter(now, ss.ttl)
			cur.enqueue(ss.lease)
			next = ss.nextSend
		}
		if !ss.probing {
			if at := latest(ss.expiry, ss.nextProbe); now.Before(at) {
				if next.IsZero() || at.Before(next) {
					next = at
				}
			} else {
				ss.probing = true
				s.wg.Add(1)
				go s.probe(ss) // one TimeToLive, bounded by probeTimeout; schedules ss again
			}
		}
		return next, overdue
	}

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		next := now.Add(time.Hour)
		overdue := false
		s.mu.Lock()
		if cur == nil && len(s.byLease) > 0 && !now.Before(retryAt) {
			gen++
			cur = s.startStreamLocked(gen)
			rescan = true
		}
		if rescan {
			rescan = false
			for _, ss := range s.byLease {
				s.scheduleLocked(ss, now)
			}
		}
		// Take what is due first, then schedule it again: a session
		// rescheduled at once (overdue) must not be taken twice.
		due = due[:0]
		for len(s.due) > 0 && !s.due[0].dueAt.After(now) {
			due = append(due, heap.Pop(&s.due).(*session))
		}
		for _, ss := range due {
			if s.byLease[ss.lease] != ss {
				continue // dead meanwhile
			}
			at, od := step(ss, now)
			overdue = overdue || od
			if !at.IsZero() {
				s.scheduleLocked(ss, at)
			}
		}
		clear(due)
		if len(s.due) > 0 {
			next = earliest(next, s.due[0].dueAt)
		}
		if cur == nil && len(s.byLease) > 0 {
			next = earliest(next, retryAt)
		}
		if now.Sub(lastPrune) > time.Minute {
			lastPrune = now
			for id, ss := range s.sessions {
				if ss.dead && now.Sub(ss.deadAt) > deadRetention {
					delete(s.sessions, id)
				}
			}
		}
		s.mu.Unlock()
		if overdue && cur != nil {
			teardown(now)
			continue
		}

		timer.Reset(next.Sub(now))
		select {
		case <-s.ctx.Done():
			return
		case <-s.wake:
		case <-timer.C:
		case ev := <-s.events:
			handle(ev)
		drain:
			for {
				select {
				case ev := <-s.events:
					handle(ev)
				default:
					break drain
				}
			}
		}
	}
}

// dueHeap orders sessions by dueAt, when the keepalive owner next needs to
// look at them. Guarded by Store.mu.
type dueHeap []*session

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].dueAt.Before(h[j].dueAt) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].dueIdx, h[j].dueIdx = i+1, j+1
}
func (h *dueHeap) Push(x any) {
	ss := x.(*session)
	ss.dueIdx = len(*h) + 1
	*h = append(*h, ss)
}
func (h *dueHeap) Pop() any {
	old := *h
	ss := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	ss.dueIdx = 0
	return ss
}

// scheduleLocked makes the keepalive owner look at ss at at (moving it if
// it is scheduled already). The caller pokes the owner if at may be
// earlier than anything it waits for.
func (s *Store) scheduleLocked(ss *session, at time.Time) {
	ss.dueAt = at
	if ss.dueIdx > 0 {
		heap.Fix(&s.due, ss.dueIdx-1)
		return
	}
	heap.Push(&s.due, ss)
}

// probe asks etcd once about a lease whose proven bound ran out. A TTL
// gives a fresh bound (probe send time + TTL); a missing lease is death by
// expiry; no answer at all is death by keepalive failure, unless a
// keepalive answer extended the bound meanwhile.
func (s *Store) probe(ss *session) {
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(s.ctx, probeTimeout(ss.ttl))
	sent := time.Now()
	resp, err := s.cli.TimeToLive(ctx, ss.lease)
	cancel()
	s.mu.Lock()
	defer s.poke()
	defer s.mu.Unlock()
	ss.probing = false
	if ss.dead || s.closed {
		return
	}
	now := time.Now()
	s.scheduleLocked(ss, now) // the owner decides what comes next
	switch {
	case err == nil && resp.TTL > 0:
		ss.extendLocked(sent.Add(time.Duration(resp.TTL) * time.Second))
	case err == nil && resp.TTL < 0, errors.Is(classify(context.Background(), err), store.ErrSessionDead):
		s.markDeadLocked(ss, telemetry.LostLeaseExpired)
	case now.Before(ss.expiry):
		// A keepalive answer arrived while probing.
	case err == nil:
		ss.nextProbe = now.Add(probeRetry) // exists, under a second left
	default:
		s.markDeadLocked(ss, telemetry.LostKeepaliveFailed)
	}
}

// startStreamLocked opens stream gen in the background.
func (s *Store) startStreamLocked(gen uint64) *kaStream {
	ctx, cancel := context.WithCancel(s.ctx)
	st := &kaStream{gen: gen, cancel: cancel, kick: make(chan struct{}, 1)}
	s.wg.Add(1)
	go s.runStream(ctx, st) // exits when the stream breaks or ctx is cancelled (teardown, Close)
	return st
}

func (s *Store) runStream(ctx context.Context, st *kaStream) {
	defer s.wg.Done()
	stream, err := s.lc.LeaseKeepAlive(clientv3.WithRequireLeader(ctx))
	if err != nil {
		s.report(ctx, kaEvent{gen: st.gen, err: err})
		return
	}
	recvDone := make(chan struct{})
	go func() { // exits when the stream breaks; cancelling ctx breaks it
		defer close(recvDone)
		for {
			resp, err := stream.Recv()
			if err != nil {
				s.report(ctx, kaEvent{gen: st.gen, err: err})
				return
			}
			s.report(ctx, kaEvent{gen: st.gen, resp: resp})
		}
	}()
	defer func() {
		st.cancel()
		<-recvDone
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-recvDone:
			return
		case <-st.kick:
		}
		for _, id := range st.take() {
			if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: id}); err != nil {
				s.report(ctx, kaEvent{gen: st.gen, err: err})
				return
			}
		}
	}
}

// report hands an event to the owner, or drops it once the stream is torn
// down.
func (s *Store) report(ctx context.Context, ev kaEvent) {
	select {
	case s.events <- ev:
	case <-ctx.Done():
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
