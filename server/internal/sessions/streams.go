package sessions

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// Stream is one KeepAlive stream in the table's registry: the server's
// stream queues replies without blocking through push.
type Stream struct {
	push func(*lockdv1.KeepAliveResponse) bool
	// sessions counts the sessions whose latest heartbeat came on this
	// stream (Table.mu).
	sessions int
}

// AddStream registers a KeepAlive stream whose replies push queues; false
// when the table drains (the stream is refused).
func (t *Table) AddStream(push func(*lockdv1.KeepAliveResponse) bool) (*Stream, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.draining.Load() {
		return nil, false
	}
	s := &Stream{push: push}
	t.streams[s] = struct{}{}
	return s, true
}

// StreamSessions is the number of sessions attached to s (their notices go
// to it), Provisional ones included.
func (t *Table) StreamSessions(s *Stream) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.sessions
}

// RemoveStream forgets an ended KeepAlive stream and wakes Drain.
func (t *Table) RemoveStream(s *Stream) {
	t.mu.Lock()
	delete(t.streams, s)
	t.mu.Unlock()
	select {
	case t.streamsGone <- struct{}{}:
	default:
	}
}

// Attach pins the session's record (creating a Provisional one), applies
// the client's acknowledgements and makes s the stream its notices go to
// (a nil s, a Heartbeat call, leaves the stream as it is). It fails with
// ErrStreamFull when s already carries MaxSessionsPerStream sessions.
func (t *Table) Attach(id store.SessionID, s *Stream, acks []uint64) (*Record, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.recs[id]
	if s != nil && (r == nil || r.stream != s) && s.sessions >= t.cfg.MaxSessionsPerStream {
		return nil, ErrStreamFull
	}
	r = t.pinLocked(id)
	if s != nil && r.stream != s {
		if r.stream != nil {
			r.stream.sessions--
		}
		r.stream = s
		s.sessions++
	}
	t.ackLocked(r, acks)
	return r, nil
}

// Draining reports whether Drain began.
func (t *Table) Draining() bool { return t.draining.Load() }

// Drain (the graceful drain of a replica, C2 #ct2-drain) refuses new
// streams from now, pushes one draining notice on every open KeepAlive
// stream and waits until every one has ended, timeout has passed, or ctx
// ended. It ends no session.
func (t *Table) Drain(ctx context.Context, timeout time.Duration) {
	t.mu.Lock()
	t.draining.Store(true)
	for s := range t.streams {
		s.push(&lockdv1.KeepAliveResponse{Draining: true})
	}
	open := len(t.streams)
	t.mu.Unlock()
	if open == 0 {
		return
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case <-t.streamsGone:
			t.mu.Lock()
			open = len(t.streams)
			t.mu.Unlock()
			if open == 0 {
				return
			}
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// CloseAll closes every session of the table (close-sessions-on-shutdown,
// C5 #ct5-close-on-shutdown) without freeing a lock its client may still
// trust: it moves every kept record that is not Gone to Draining (nothing
// extends it any more), sends a lock-lost notice (SERVER_SHUTDOWN) for
// every lock it tracks, and closes a session only once the client
// acknowledged all of the session's notices, or the trust this server last
// granted it (trustUntil) ran out. Sessions still unsafe to close when ctx
// ends are left to expire, never closed early.
func (t *Table) CloseAll(ctx context.Context) error {
	t.mu.Lock()
	t.closingAll = true
	t.drainWake = make(chan struct{}, 1)
	var all []*Record
	for _, r := range t.recs {
		if !r.kept || r.state == Gone || !t.move(r, Draining) {
			continue
		}
		r.pins++
		t.unschedule(r)
		for key, tok := range r.locks {
			delete(r.locks, key)
			t.endedLocked(r, key)
			t.noticeLocked(r, key, tok, lockdv1.LockLostReason_LOCK_LOST_REASON_SERVER_SHUTDOWN)
		}
		all = append(all, r)
	}
	t.mu.Unlock()

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var errs []error
	for len(all) > 0 {
		ready, rest, next := t.drainReady(all)
		errs = append(errs, t.closeDrainedAll(ctx, ready)...)
		if all = rest; len(all) == 0 {
			break
		}
		timer.Reset(next.Sub(t.now()))
		select {
		case <-t.drainWake:
			timer.Stop() // Go ≥ 1.23 timers: no stale tick to drain
		case <-timer.C:
		case <-ctx.Done():
			for _, r := range all {
				t.Unpin(r)
			}
			return errors.Join(append(errs, fmt.Errorf("server: close sessions on shutdown: %d sessions left to expire "+
				"(their clients had neither acknowledged nor reached their deadline): %w", len(all), ctx.Err()))...)
		}
	}
	return errors.Join(errs...)
}

// CloseAllConcurrency is how many sessions CloseAll closes on the store at
// once: one at a time, the closes of a flood of sessions (thousands, each a
// backend round trip) overran the shutdown bound (issue 23, F3).
const CloseAllConcurrency = 32

// closeDrainedAll closes ready (pinned by CloseAll), CloseAllConcurrency
// at a time, and returns the errors; its goroutines end before it returns.
func (t *Table) closeDrainedAll(ctx context.Context, ready []*Record) []error {
	var (
		mu   sync.Mutex
		errs []error
		g    errgroup.Group
	)
	g.SetLimit(CloseAllConcurrency)
	for _, r := range ready {
		g.Go(func() error {
			if err := t.closeDrained(ctx, r); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait() // every function returns nil; the errors are in errs
	return errs
}

// drainReady splits draining records into those safe to close now (the
// client acknowledged every notice of a session whose grants the table
// knows, or the trust granted to it ran out) and the rest, with the
// earliest instant one of the rest becomes safe by time.
func (t *Table) drainReady(all []*Record) (ready, rest []*Record, next time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	next = now.Add(time.Hour)
	for _, r := range all {
		if r.state == Gone || (r.seeded && len(r.notices) == 0) || !now.Before(r.trustUntil) {
			ready = append(ready, r)
			continue
		}
		rest = append(rest, r)
		if r.trustUntil.Before(next) {
			next = r.trustUntil
		}
	}
	return ready, rest, next
}

// closeDrained tells the client of one drained session (pinned by
// CloseAll) that it is dead — it trusts none of its locks any more — and
// closes it on the store.
func (t *Table) closeDrained(ctx context.Context, r *Record) error {
	defer t.Unpin(r)
	t.mu.Lock()
	if r.stream != nil && r.state != Gone {
		r.stream.push(&lockdv1.KeepAliveResponse{SessionId: string(r.id), Live: false})
	}
	t.mu.Unlock()
	if _, err := t.be.CloseSession(telemetry.WithServerClose(ctx), r.id); err != nil {
		return fmt.Errorf("server: close session on shutdown: %w", err)
	}
	t.MarkGone(r)
	return nil
}
