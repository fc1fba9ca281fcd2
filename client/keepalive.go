package client

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc/peer"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// keepaliver sends the heartbeats of every session of a Client over one
// shared KeepAlive stream, reconnecting with backoff when it breaks.
type keepaliver struct {
	c *Client

	mu       sync.Mutex
	sessions map[string]*kaEntry
	wake     chan struct{}
	gen      uint64 // the last stream's number (run's goroutine only)
	// shadows are the streams left because they stalled that are still
	// sent heartbeats (keepalive_shadow.go; run's goroutine only).
	shadows []*shadow
	// epoch and phase place the client's heartbeat grid (aligned): for an
	// interval i its instants are epoch + phase×i + n×i. The phase is
	// random per client, so that clients do not beat in step.
	epoch time.Time
	phase float64
}

// kaEntry is a session's heartbeat schedule (owned by the run loop once
// added; the map itself is guarded by keepaliver.mu).
type kaEntry struct {
	s    *Session
	next time.Time // when to send the next heartbeat
}

// beat is a heartbeat in flight: which session, when it was sent, and the
// session's lockSeq then (the locks its answer must list).
type beat struct {
	s    *Session
	sent time.Time
	seq  uint64
}

func newKeepaliver(c *Client) *keepaliver {
	return &keepaliver{c: c, sessions: map[string]*kaEntry{}, wake: make(chan struct{}, 1),
		epoch: c.clock.Now(), phase: rand.Float64()}
}

func (k *keepaliver) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

func (k *keepaliver) add(s *Session) {
	k.mu.Lock()
	k.sessions[s.id] = &kaEntry{s: s, next: k.aligned(k.c.clock.Now(), s.interval)}
	k.mu.Unlock()
	k.poke()
}

func (k *keepaliver) remove(s *Session) {
	k.mu.Lock()
	if e := k.sessions[s.id]; e != nil && e.s == s {
		delete(k.sessions, s.id)
	}
	k.mu.Unlock()
}

func (k *keepaliver) all() []*Session {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]*Session, 0, len(k.sessions))
	for _, e := range k.sessions {
		out = append(out, e.s)
	}
	return out
}

func (k *keepaliver) lookup(id string) *Session {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e := k.sessions[id]; e != nil {
		return e.s
	}
	return nil
}

// maxBeatSlack bounds how early a heartbeat is sent to share a wake-up
// with others (beatSlack).
const maxBeatSlack = 50 * time.Millisecond

// beatSlack is how much earlier than due a session's heartbeat may be sent:
// a tenth of its interval, at most maxBeatSlack.
func beatSlack(interval time.Duration) time.Duration { return min(interval/10, maxBeatSlack) }

// aligned returns when a session of the given interval whose heartbeat
// (or OpenSession) was sent at t sends the next (issue 24, C2
// #ct2-deadline): the last instant of the client's grid for that interval
// at or before t + interval. It is never later than an interval after the
// send, and it is the same instant for all the client's sessions of that
// interval, which therefore leave in one wake-up and reach the server
// together (PostgreSQL commits them in one UPDATE). A session off the grid
// (just opened, or sent early by beatSoon) joins it with one heartbeat up
// to an interval early. One sent at most beatSlack ahead of its grid
// instant (it shared a wake-up that came that little early) keeps its own
// place, t + interval: taking the grid instant would send it again a slack
// later; the sessions of the grid then go with it by the slack.
func (k *keepaliver) aligned(t time.Time, interval time.Duration) time.Time {
	if interval <= 0 { // never for a session NewSession opened
		return t
	}
	due := t.Add(interval)
	origin := k.epoch.Add(time.Duration(k.phase * float64(interval)))
	at := origin.Add(due.Sub(origin) / interval * interval)
	if at.After(due) { // due before origin: the quotient was rounded up
		at = at.Add(-interval)
	}
	if at.Sub(t) <= beatSlack(interval) {
		return due
	}
	return at
}

// run is the keepaliver's goroutine. It exits when the client's context ends
// (Close).
func (k *keepaliver) run() {
	defer k.c.wg.Done()
	ctx := k.c.ctx
	attempt := 0
	for {
		// No stream while there is no session.
		for len(k.all()) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-k.wake:
			}
		}
		start := k.c.clock.Now()
		healthy, moved := k.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		if moved {
			// A replica set aside (draining, stalled): open the stream
			// on another at once (C2 #ct2-failover).
			attempt = 0
			continue
		}
		if !healthy && k.c.failover != nil {
			// Nothing answered: the addresses left may all be down; let
			// the ones set aside be tried again.
			k.c.failover.clearAside()
		}
		if healthy || k.c.clock.Now().Sub(start) > 10*time.Second {
			attempt = 0
		}
		// The first reconnect after a stream that worked goes at once: a
		// replica died and pick_first connects to another.
		if !healthy || attempt > 0 {
			if !k.c.sleep(ctx, k.c.backoff(attempt)) {
				return
			}
		}
		attempt++
	}
}

// stream runs one KeepAlive stream until it breaks or ctx ends. It reports
// whether the stream carried at least one reply, and whether it left the
// stream's replica on purpose (draining or stalled, set aside: moved). This
// goroutine sends the heartbeats; a receiver goroutine applies the replies
// as they arrive, so reading never waits for sending. A stream left on
// purpose keeps its receiver until the heartbeats in flight on it are
// answered (linger, C2 #ct2-failover).
func (k *keepaliver) stream(ctx context.Context) (healthy, moved bool) {
	sctx, cancel := context.WithCancel(ctx)
	stream, err := k.c.api.KeepAlive(sctx)
	if err != nil {
		cancel()
		k.c.log.LogAttrs(ctx, slog.LevelDebug, "keepalive stream failed", slog.String("error", err.Error()))
		return false, false
	}
	k.gen++
	fl := &flight{beats: map[uint64]beat{}, gen: k.gen, drain: make(chan struct{}), answered: make(chan struct{}, 1),
		gone: make(chan struct{}), lastRecv: k.c.clock.Now()}
	broken := make(chan error, 1)
	recvDone := make(chan struct{})
	go func() { // exits when the stream ends: cancelled on return below, or by linger
		defer close(recvDone)
		for {
			r, err := stream.Recv()
			if err != nil {
				broken <- err
				return
			}
			fl.mu.Lock()
			fl.replied = true
			fl.lastRecv = k.c.clock.Now()
			fl.mu.Unlock()
			if m := r.GetBatchMax(); m > 0 { // the stream's server takes batches (C2 #ct2-keepalive-batch)
				fl.batchMax.Store(m)
			}
			k.handle(r, fl)
		}
	}()
	var nextID uint64
	stalled := false // left because it stalled: still sent heartbeats (shadow)
	defer func() {
		fl.mu.Lock()
		healthy = fl.replied
		fl.mu.Unlock()
		if !moved {
			close(fl.gone)
			cancel()
			<-recvDone
			return
		}
		// Left on purpose: the replica may still answer what it was sent
		// (C2 #ct2-failover). Nothing more is sent on it, unless it
		// stalled: then heartbeats go on it too until a later stream
		// answers (a stall move keeps sending).
		fl.left.Store(true)
		if stalled {
			k.addShadow(stream, fl, nextID)
		}
		k.c.wg.Add(1)
		go k.linger(ctx, fl, cancel, broken, recvDone) // exits once it sends no more and those answers came or were forgotten, the stream broke, or Close
	}()

	// Every session beats at once on a new stream.
	now := k.c.clock.Now()
	k.mu.Lock()
	for _, e := range k.sessions {
		e.next = now
	}
	k.mu.Unlock()

	drain := fl.drain  // nil once a draining reply was handled
	stallDone := false // a stall was found with nowhere else to go
	tick := newAlarm(k.c.clock)
	defer tick.stop()
	for {
		// Send the heartbeats that are due and find the next due time.
		now := k.c.clock.Now()
		var due []*kaEntry
		next := now.Add(time.Hour)
		k.mu.Lock()
		for _, e := range k.sessions {
			// A heartbeat due within the slack goes now, with those that
			// are due: sending early is always safe, and heartbeats that
			// leave together share the stream's writes and this loop's
			// wake-ups (with many sessions the loop would otherwise wake,
			// and scan every session, once per heartbeat).
			if !now.Add(beatSlack(e.s.interval)).Before(e.next) {
				due = append(due, e)
				e.next = k.aligned(now, e.s.interval)
			}
			if e.next.Before(next) {
				next = e.next
			}
		}
		k.mu.Unlock()
		k.shadowsAfter(fl)
		if !k.send(stream, fl, due, &nextID) { // keepalive_batch.go
			return // the receive side says why
		}
		k.sendShadows(due)
		// Forget heartbeats unanswered for a TTL: ignoring a reply is
		// always safe.
		fl.mu.Lock()
		var oldest time.Time // the send time of the oldest beat in flight
		stall := time.Duration(0)
		for id, b := range fl.beats {
			if now.Sub(b.sent) > b.s.ttl {
				delete(fl.beats, id)
				continue
			}
			if oldest.IsZero() || b.sent.Before(oldest) {
				oldest = b.sent
			}
			if st := stallAfter(b.s.interval); stall == 0 || st < stall {
				stall = st
			}
		}
		lastRecv := fl.lastRecv
		fl.mu.Unlock()
		if k.c.failover != nil && !stallDone && !oldest.IsZero() {
			// A stalled stream (C2 #ct2-failover): a heartbeat without an
			// answer, and nothing at all on the stream, for the stall
			// bound. Move if there is another replica to go to.
			quiet := oldest
			if lastRecv.After(quiet) {
				quiet = lastRecv
			}
			if at := quiet.Add(stall); !now.Before(at) {
				if k.setAside(stream, "keepalive stream stalled", false) {
					stalled = true
					return false, true
				}
				stallDone = true
			} else if at.Before(next) {
				next = at
			}
		}

		tick.set(next.Sub(k.c.clock.Now()))
		select {
		case <-ctx.Done():
			return
		case <-k.wake:
		case <-tick.c:
		case <-drain:
			// The replica drains (C2 #ct2-drain): go elsewhere if there is
			// somewhere else, else keep heartbeating here.
			drain = nil
			if k.c.failover != nil && k.setAside(stream, "replica draining", true) {
				return false, true
			}
		case err := <-broken:
			k.c.log.LogAttrs(ctx, slog.LevelDebug, "keepalive stream broke", slog.String("error", err.Error()))
			return
		}
	}
}

// linger keeps receiving on a stream the client left on purpose (its
// replica drains, or the stream stalled; C2 #ct2-failover): the answers to
// the heartbeats it carried still extend trust, counted from their own send
// times, as on any stream — a draining replica keeps answering, and one
// that was merely slow (adopting a session takes several backend round
// trips) would otherwise have its answer thrown away by the move. While the
// stream is still sent heartbeats (a stalled one, keepalive_shadow.go) it
// stays. It cuts the stream once it sends no more and every heartbeat it
// carried is answered or forgotten (a TTL after its send, as on a stream in
// use), when the stream breaks, or when the client closes.
func (k *keepaliver) linger(ctx context.Context, fl *flight, cancel context.CancelFunc, broken <-chan error, recvDone <-chan struct{}) {
	defer k.c.wg.Done()
	defer func() {
		close(fl.gone)
		cancel()
		<-recvDone
	}()
	forget := newAlarm(k.c.clock)
	defer forget.stop()
	for {
		now := k.c.clock.Now()
		var until time.Time // when the last heartbeat still in flight is forgotten
		fl.mu.Lock()
		for id, b := range fl.beats {
			at := b.sent.Add(b.s.ttl)
			if !now.Before(at) {
				delete(fl.beats, id)
				continue
			}
			if at.After(until) {
				until = at
			}
		}
		fl.mu.Unlock()
		switch {
		case !until.IsZero():
			forget.set(until.Sub(now))
		case fl.sending.Load():
			forget.stop() // nothing in flight: wait for a send (sendShadows pokes answered) or the end of the sends
		default:
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-broken:
			return
		case <-fl.answered:
		case <-forget.c:
		}
	}
}

// alarm is a re-armable timer on the client's clock: c receives (buffered
// 1, never blocking the timer) when the latest set runs out.
type alarm struct {
	clock Clock
	c     chan struct{}
	t     Timer
}

func newAlarm(clock Clock) *alarm { return &alarm{clock: clock, c: make(chan struct{}, 1)} }

// set arms the alarm to ring after d, replacing an earlier arming.
func (a *alarm) set(d time.Duration) {
	a.stop()
	a.t = a.clock.AfterFunc(d, func() {
		select {
		case a.c <- struct{}{}:
		default:
		}
	})
}

func (a *alarm) stop() {
	if a.t != nil {
		a.t.Stop()
	}
}

// stallAfter is how long a stream may stay silent with a heartbeat
// unanswered before the client moves (C2 #ct2-failover): half the
// heartbeat interval, at least minStall.
func stallAfter(interval time.Duration) time.Duration { return max(interval/2, minStall) }

// minStall is the shortest stall bound.
const minStall = 250 * time.Millisecond

// setAside sets the stream's replica aside; false when there is nowhere
// else to go.
func (k *keepaliver) setAside(stream lockdv1.LockService_KeepAliveClient, why string, draining bool) bool {
	p, ok := peer.FromContext(stream.Context())
	if !ok || !k.c.failover.setAside(p.Addr, draining) {
		return false
	}
	k.c.log.LogAttrs(context.Background(), slog.LevelDebug, "moving to another replica",
		slog.String("reason", why), slog.String("from", p.Addr.String()))
	return true
}
