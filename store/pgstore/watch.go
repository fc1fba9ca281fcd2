package pgstore

import (
	"context"
	"encoding/json"
	"fmt"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

const (
	// watchBuffer is how many events a watch consumer may fall behind
	// before its watch breaks with ErrContention.
	watchBuffer = 256
)

// watch is one WatchFrom call's subscription. All fields are guarded by s.mu.
type watch struct {
	prefix string
	// ch has room for watchBuffer events plus the final error event: the
	// dispatcher sends an event only while fewer than watchBuffer are
	// queued, so every send, including the final one, is non-blocking.
	ch     chan store.Event
	sync   string        // marker that activates the watch
	active bool          // the marker arrived: events are delivered
	ready  chan struct{} // closed when active or ended
	done   bool
	err    error  // why a watch ended before it became active
	stop   func() // unregisters the context.AfterFunc
}

// withCursor is ev with the cursor of a PostgreSQL watch.
func withCursor(ev store.Event) store.Event {
	ev.Cursor = pgCursor
	return ev
}

// pgCursor is the one cursor of a PostgreSQL watch: NOTIFY keeps no
// history, so it names no position (C2 #ct2-watch-resume).
const pgCursor = "pg"

// WatchFrom implements store.LockStore. The watch becomes active when a
// sync marker it sends through the database comes back on the listening
// connection: NOTIFY delivers in commit order, so from then on it sees every
// change committed after the marker, hence every change committed after
// WatchFrom returns, and nothing committed before it was called.
// PostgreSQL cannot replay what happened after a cursor (NOTIFY keeps no
// history): a watch resumed after any cursor (after not "") starts with
// EventResync, then goes on from now (C2 #ct2-watch-resume, a divergence of
// docs/backends.md).
func (s *Store) WatchFrom(ctx context.Context, prefix, after string) (string, <-chan store.Event, error) {
	ch, err := s.watch(ctx, prefix, after != "")
	if err != nil {
		return "", nil, err
	}
	return pgCursor, ch, nil
}

// watch is WatchFrom, whose first event is EventResync with resync.
func (s *Store) watch(ctx context.Context, prefix string, resync bool) (_ <-chan store.Event, err error) {
	if err := store.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("pgstore: watch: %w", err)
	}
	if err := s.begin(ctx, "watch"); err != nil {
		return nil, err
	}
	defer s.metrics.Observe(telemetry.OpWatch)(&err)
	s.mu.Lock()
	if !s.listening {
		s.mu.Unlock()
		return nil, fmt.Errorf("pgstore: watch: notification listener is reconnecting: %w", store.ErrUnavailable)
	}
	s.syncSeq++
	w := &watch{
		prefix: prefix,
		ch:     make(chan store.Event, watchBuffer+1),
		sync:   fmt.Sprintf("%s/%d", s.instance, s.syncSeq),
		ready:  make(chan struct{}),
	}
	if resync { // before any event: the watch is not registered yet
		w.ch <- store.Event{Kind: store.EventResync, Cursor: pgCursor}
	}
	s.watches[w] = struct{}{}
	s.mu.Unlock()

	payload, err := json.Marshal(notice{Kind: "sync", Sync: w.sync})
	if err == nil {
		_, err = s.pool.Exec(ctx, s.q.notify, s.channel, string(payload))
	}
	if err == nil {
		select {
		case <-w.ready:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	s.mu.Lock()
	if err == nil && !w.active {
		err = w.err // the listener broke before the marker arrived
	}
	if err != nil {
		s.endWatch(w, nil)
		s.mu.Unlock()
		return nil, classify(ctx, "watch", err)
	}
	// Ends the watch when ctx ends; runs at once if it already has.
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.endWatch(w, nil)
	})
	w.stop = func() { stop() }
	s.mu.Unlock()
	return w.ch, nil
}

// endWatch ends w: a delivering watch gets err (if any) as its last event,
// then its channel is closed. s.mu is held.
func (s *Store) endWatch(w *watch, err error) {
	if w.done {
		return
	}
	w.done = true
	delete(s.watches, w)
	if w.stop != nil {
		w.stop()
	}
	if w.active {
		if err != nil {
			w.ch <- store.Event{Err: err}
		}
	} else {
		w.err = err
		if w.err == nil {
			w.err = errClosed
		}
		close(w.ready)
	}
	close(w.ch)
}
