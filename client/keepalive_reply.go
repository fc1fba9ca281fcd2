package client

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// flight holds the heartbeats of one stream that await their reply.
type flight struct {
	mu      sync.Mutex
	beats   map[uint64]beat
	replied bool // the stream carried anything (healthy: the reconnect backoff)
	// kept: the stream carried a live answer to one of its heartbeats, so
	// its replica keeps the session; a notice or an error answer is not one
	// (C2 #ct2-failover). The shadows stop then (keepalive_shadow.go).
	kept bool
	// gen numbers the stream: notice acknowledgements go back only on the
	// stream the notice came on (C2 #ct2-failover).
	gen      uint64
	lastRecv time.Time // when the stream last carried anything
	// drain is closed by the first reply that says the replica drains.
	drain     chan struct{}
	drainOnce sync.Once
	// answered is poked whenever a heartbeat of this stream is answered,
	// or sent while it is a shadow (capacity 1): linger looks again.
	answered chan struct{}
	// left: the client left this stream on purpose (linger); notices
	// arriving on it are applied, not acknowledged.
	left atomic.Bool
	// sending: a stream left because it stalled is still sent heartbeats
	// (a shadow, keepalive_shadow.go); linger keeps it while set.
	sending atomic.Bool
	// gone is closed when the stream is cut (the stream's own end, or
	// linger's).
	gone chan struct{}
	// batchMax is the batch_max the stream's server advertised (C2
	// #ct2-keepalive-batch): 0 until a message said it takes batches.
	batchMax atomic.Uint32
}

// ackGen is the stream number that acknowledgements of notices arriving on
// fl go back on, 0 (none) once the client left it.
func (fl *flight) ackGen() uint64 {
	if fl.left.Load() {
		return 0
	}
	return fl.gen
}

// handle applies one reply or notice, or each answer of a batch message
// (C2 #ct2-keepalive-batch) as a reply of its own.
func (k *keepaliver) handle(r *lockdv1.KeepAliveResponse, fl *flight) {
	if r.GetDraining() {
		fl.drainOnce.Do(func() { close(fl.drain) })
	}
	if len(r.GetBatch()) > 0 {
		for _, a := range r.GetBatch() {
			k.handle(a, fl)
		}
		return
	}
	var s *Session
	var b beat
	answered := false
	if r.GetRequestId() != 0 {
		fl.mu.Lock()
		if b, answered = fl.beats[r.GetRequestId()]; answered {
			delete(fl.beats, r.GetRequestId())
			s = b.s
		}
		fl.mu.Unlock()
		if answered {
			select {
			case fl.answered <- struct{}{}:
			default:
			}
		}
	}
	if s == nil { // a notice, or an answer to a forgotten request: only its notices count
		answered = false
		s = k.lookup(r.GetSessionId())
	}
	if s == nil || s.id != r.GetSessionId() {
		return
	}
	ack := false
	for _, l := range r.GetLost() {
		ack = s.lockLost(l, fl.ackGen()) || ack
	}
	if ack && r.GetLive() {
		k.beatSoon(s, 0) // acknowledge at once: the server keeps repeating the notice until then
	}
	switch {
	case r.GetError() != nil:
		// Transient: keep the current deadline and try again soon. A held
		// set still ends the locks it does not list.
		err := fromSessionError(r.GetError())
		k.c.log.LogAttrs(context.Background(), slog.LevelDebug, "heartbeat failed", slog.String("error", err.Error()))
		if errors.Is(err, ErrPermissionDenied) {
			// The server refuses this session's secret: no later
			// heartbeat can succeed (C2 #ct2-ownership).
			s.end(err)
			return
		}
		if answered {
			if r.GetHeld() != nil {
				s.answer(b.sent, b.seq, false, 0, r.GetHeld())
			}
			k.beatSoon(s, min(s.interval/2, time.Second))
		}
	case !r.GetLive(): // dead is terminal, whichever request this answers
		s.end(ErrSessionDead)
	case answered:
		fl.mu.Lock()
		fl.kept = true
		fl.mu.Unlock()
		s.answer(b.sent, b.seq, true, ms(r.GetRemainingMs()), r.GetHeld())
		k.beatBeforeDeadline(s)
	}
}

// beatBeforeDeadline, after a live answer, brings the session's next
// heartbeat forward to halfway from now to the earliest deadline it holds,
// its own or a lock's, and no sooner than beatSlack (C2 #ct2-deadline):
// Remaining can leave less than an interval (etcd proves a lease from its
// last keepalive; a replica that adopts a session knows only whole seconds
// at first), and an answer must still have room to arrive before the
// deadline passes. Not after an error answer: heartbeats must not multiply
// while the backend fails.
func (k *keepaliver) beatBeforeDeadline(s *Session) {
	if at, ok := s.earliestDeadline(); ok {
		k.beatSoon(s, max(at.Sub(k.c.clock.Now())/2, beatSlack(s.interval)))
	}
}

// beatSoon moves the session's next heartbeat to at most after from now,
// and wakes the sender if it moved.
func (k *keepaliver) beatSoon(s *Session, after time.Duration) {
	moved := false
	k.mu.Lock()
	if e := k.sessions[s.id]; e != nil && e.s == s {
		if soon := k.c.clock.Now().Add(after); soon.Before(e.next) {
			e.next, moved = soon, true
		}
	}
	k.mu.Unlock()
	if moved {
		k.poke()
	}
}
