package etcdstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// watchBuffer is the capacity of a WatchFrom channel; one more slot is kept
// for the final error event.
const watchBuffer = 256

// WatchFrom implements store.LockStore (C2 #ct2-watch, #ct2-watch-resume).
// It reports changes to held keys under prefix in commit order, from one
// etcd watch over the grant keys and their release markers. A grant key
// created is "acquired"; a grant key deleted is "released" or "revoked" when
// a marker with that reason was written in the same revision, else
// "expired" (its session ended: expiry, loss or close). A grant key
// overwritten is a hand-over (DeleteIfOwner with waiters): "released" for
// the old grant, then "acquired" for the new one. A value marker (SetValue)
// is "value".
//
// It starts right after the cursor after from etcd's history ("": now). A
// cursor is "etcd:<shift>:<revision>:<n>": every event of earlier revisions
// and the first n of that revision were delivered. A cursor of another
// epoch, not a cursor, one ahead of the store or one whose history was
// compacted gives EventResync and a watch from now; so does a compaction
// while the watch runs.
func (s *Store) WatchFrom(ctx context.Context, prefix, after string) (start string, _ <-chan store.Event, err error) {
	defer s.met.Observe(telemetry.OpWatch)(&err)
	if err := store.ValidatePrefix(prefix); err != nil {
		return "", nil, fmt.Errorf("etcdstore: watch: %w", err)
	}
	if err := s.ready(ctx); err != nil {
		return "", nil, fmt.Errorf("etcdstore: watch: %w", err)
	}
	pos, resumable := s.parseCursor(after)
	resync := after != "" && !resumable
	w, err := s.openWatch(ctx, prefix, pos.rev)
	if err == nil && resumable && pos.rev > w.head+1 {
		w.cancel() // a cursor ahead of the store: not this store's
		resync, resumable = true, false
		w, err = s.openWatch(ctx, prefix, 0)
	}
	if err != nil {
		return "", nil, err
	}
	if !resumable {
		pos = cursor{rev: w.head + 1}
	}
	out := make(chan store.Event, watchBuffer+1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		w.cancel()
		return "", nil, errClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	start = s.formatCursor(pos) // before the goroutine moves pos
	if resync {
		out <- store.Event{Kind: store.EventResync, Cursor: start}
	}
	go func() { // exits when ctx ends, the watch breaks, or Close
		defer s.wg.Done()
		defer close(out)
		for {
			compacted := s.pump(ctx, w.ch, out, &pos)
			w.cancel()
			if !compacted {
				return
			}
			// The history after pos was compacted away: go on from now.
			var err error // not watchFrom's: it has returned
			if w, err = s.openWatch(ctx, prefix, 0); err != nil {
				if ctx.Err() == nil {
					out <- store.Event{Err: err} // the reserved slot: never blocks
				}
				return
			}
			pos = cursor{rev: w.head + 1}
			if len(out) >= watchBuffer {
				w.cancel()
				out <- store.Event{Err: fmt.Errorf("etcdstore: watch: %w: consumer fell %d events behind", store.ErrContention, watchBuffer)}
				return
			}
			out <- store.Event{Kind: store.EventResync, Cursor: s.formatCursor(pos)}
		}
	}()
	return start, out, nil
}

// cursor is a watch position: every event of revisions before rev and the
// first n events of rev were delivered.
type cursor struct{ rev, n int64 }

func (s *Store) formatCursor(c cursor) string {
	return fmt.Sprintf("etcd:%d:%d:%d", s.shift, c.rev, c.n)
}

// parseCursor reads a cursor of this store's epoch.
func (s *Store) parseCursor(v string) (cursor, bool) {
	f := strings.Split(v, ":")
	if len(f) != 4 || f[0] != "etcd" || f[1] != strconv.FormatInt(s.shift, 10) {
		return cursor{}, false
	}
	rev, err1 := strconv.ParseInt(f[2], 10, 64)
	n, err2 := strconv.ParseInt(f[3], 10, 64)
	if err1 != nil || err2 != nil || rev < 1 || n < 0 {
		return cursor{}, false
	}
	return cursor{rev, n}, true
}

// etcdWatch is one established etcd watch.
type etcdWatch struct {
	ch     clientv3.WatchChan
	cancel context.CancelFunc
	head   int64 // the store's revision when it was established
}

// openWatch establishes an etcd watch of prefix from rev (0: now).
func (s *Store) openWatch(ctx context.Context, prefix string, rev int64) (etcdWatch, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithCreatedNotify()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	wch := s.cli.Watch(wctx, s.lockKey(prefix), opts...)
	select {
	case wr, ok := <-wch:
		if !ok || wr.Canceled || !wr.Created {
			cancel()
			return etcdWatch{}, fmt.Errorf("etcdstore: watch: %w", s.watchEnded(ctx, wr))
		}
		return etcdWatch{ch: wch, cancel: cancel, head: wr.Header.Revision}, nil
	case <-ctx.Done():
		cancel()
		return etcdWatch{}, fmt.Errorf("etcdstore: watch: %w", ctx.Err())
	case <-s.ctx.Done():
		cancel()
		return etcdWatch{}, errClosed
	}
}

// pump turns etcd watch responses into events until the watch ends,
// skipping those pos says were delivered and advancing pos. A final event
// with Err is sent when it ends for any reason but ctx or compaction;
// compacted reports the latter.
func (s *Store) pump(ctx context.Context, wch clientv3.WatchChan, out chan<- store.Event, pos *cursor) (compacted bool) {
	fail := func(err error) {
		if ctx.Err() == nil {
			out <- store.Event{Err: fmt.Errorf("etcdstore: watch: %w", err)} // the reserved slot: never blocks
		}
	}
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case wr, ok = <-wch:
		case <-ctx.Done():
			return false
		case <-s.ctx.Done():
			fail(errClosed)
			return false
		}
		if ok && wr.CompactRevision != 0 && ctx.Err() == nil {
			return true // WatchFrom goes on with a resync
		}
		if !ok || wr.Canceled {
			fail(s.watchEnded(ctx, wr))
			return false
		}
		var rev, n int64
		for _, ev := range s.watchEvents(wr.Events) {
			if ev.rev != rev {
				rev, n = ev.rev, 0
			}
			n++
			if rev < pos.rev || (rev == pos.rev && n <= pos.n) {
				continue // delivered before the watch resumed
			}
			if len(out) >= watchBuffer {
				fail(fmt.Errorf("%w: consumer fell %d events behind", store.ErrContention, watchBuffer))
				return false
			}
			*pos = cursor{rev, n}
			ev.Cursor = s.formatCursor(*pos)
			out <- ev.Event
		}
	}
}

// revEvent is an event and the revision that made it.
type revEvent struct {
	store.Event
	rev int64
}

// watchEvents classifies one watch response's etcd events. A release and its
// marker share a revision, and etcd never splits one revision's events
// across responses.
func (s *Store) watchEvents(evs []*clientv3.Event) []revEvent {
	type keyRev struct {
		key string
		rev int64
	}
	marks := make(map[keyRev]string)
	for _, ev := range evs {
		if ev.Type != mvccpb.PUT {
			continue
		}
		k := string(ev.Kv.Key)
		if n := len(k); n > 0 && k[n-1] == 0 {
			if key, ok := s.userKey(ev.Kv.Key[:n-1]); ok {
				marks[keyRev{key, ev.Kv.ModRevision}] = string(ev.Kv.Value)
			}
		}
	}
	var out []revEvent
	ended := func(key string, ev *clientv3.Event) {
		e := store.Event{Kind: store.EventExpired, Key: key}
		if ev.PrevKv != nil {
			if g, err := s.grantOf(key, ev.PrevKv); err == nil {
				e.Session, e.Token = g.Session, g.Token
			}
		}
		switch marks[keyRev{key, ev.Kv.ModRevision}] {
		case markReleased:
			e.Kind = store.EventReleased
		case markRevoked:
			e.Kind = store.EventRevoked
		case markMaxHold:
			e.Kind = store.EventMaxHold
		}
		out = append(out, revEvent{e, ev.Kv.ModRevision})
	}
	for _, ev := range evs {
		key, ok := s.userKey(ev.Kv.Key)
		if !ok {
			if e, ok := s.valueEvent(ev); ok {
				out = append(out, revEvent{e, ev.Kv.ModRevision})
			}
			continue // a marker, or foreign
		}
		switch ev.Type {
		case mvccpb.DELETE:
			ended(key, ev)
		case mvccpb.PUT:
			if !ev.IsCreate() {
				// A hand-over: the released grant and the next one share
				// this revision.
				ended(key, ev)
			}
			if g, err := s.grantOf(key, ev.Kv); err == nil {
				out = append(out, revEvent{store.Event{Kind: store.EventAcquired, Key: key, Session: g.Session, Token: g.Token}, ev.Kv.ModRevision})
			}
		}
	}
	return out
}

// valueEvent reads a value marker (SetValue) as a value event.
func (s *Store) valueEvent(ev *clientv3.Event) (store.Event, bool) {
	k := ev.Kv.Key
	if ev.Type != mvccpb.PUT || len(k) == 0 || k[len(k)-1] != 0 {
		return store.Event{}, false
	}
	key, ok := s.userKey(k[:len(k)-1])
	rest, isValue := strings.CutPrefix(string(ev.Kv.Value), markValue)
	if !ok || !isValue {
		return store.Event{}, false
	}
	id, tok, _ := strings.Cut(rest, " ")
	t, err := strconv.ParseUint(tok, 10, 64)
	if err != nil || id == "" {
		return store.Event{}, false
	}
	return store.Event{Kind: store.EventValue, Key: key, Session: store.SessionID(id), Token: t}, true
}

// watchEnded classifies a watch that ended without the awaited delete.
func (s *Store) watchEnded(ctx context.Context, wr clientv3.WatchResponse) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := wr.Err(); err != nil {
		return classify(ctx, err)
	}
	return fmt.Errorf("%w: watch closed", store.ErrUnavailable)
}
