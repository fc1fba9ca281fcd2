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

// watchBuffer is the capacity of a Watch channel; one more slot is kept
// for the final error event.
const watchBuffer = 256

// Watch reports changes to held keys under prefix in commit order, from one
// etcd watch over the grant keys and their release markers. A grant key
// created is "acquired"; a grant key deleted is "released" or "revoked" when
// a marker with that reason was written in the same revision, else
// "expired" (its session ended: expiry, loss or close). A grant key
// overwritten is a hand-over (DeleteIfOwner with waiters): "released" for
// the old grant, then "acquired" for the new one. A value marker (SetValue)
// is "value".
func (s *Store) Watch(ctx context.Context, prefix string) (_ <-chan store.Event, err error) {
	defer s.met.Observe(telemetry.OpWatch)(&err)
	if err := store.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("etcdstore: watch: %w", err)
	}
	if err := s.ready(ctx); err != nil {
		return nil, fmt.Errorf("etcdstore: watch: %w", err)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := s.cli.Watch(wctx, s.lockKey(prefix), clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithCreatedNotify())
	select {
	case wr, ok := <-wch:
		if !ok || wr.Canceled || !wr.Created {
			cancel()
			return nil, fmt.Errorf("etcdstore: watch: %w", s.watchEnded(ctx, wr))
		}
	case <-ctx.Done():
		cancel()
		return nil, fmt.Errorf("etcdstore: watch: %w", ctx.Err())
	case <-s.ctx.Done():
		cancel()
		return nil, errClosed
	}
	out := make(chan store.Event, watchBuffer+1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		return nil, errClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() { // exits when ctx ends, the watch breaks, or Close
		defer s.wg.Done()
		defer close(out)
		defer cancel()
		s.pump(ctx, wch, out)
	}()
	return out, nil
}

// pump turns etcd watch responses into events until the watch ends. A
// final event with Err is sent when it ends for any reason but ctx.
func (s *Store) pump(ctx context.Context, wch clientv3.WatchChan, out chan<- store.Event) {
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
			return
		case <-s.ctx.Done():
			fail(errClosed)
			return
		}
		if !ok || wr.Canceled {
			fail(s.watchEnded(ctx, wr))
			return
		}
		for _, ev := range s.watchEvents(wr.Events) {
			if len(out) >= watchBuffer {
				fail(fmt.Errorf("%w: consumer fell %d events behind", store.ErrContention, watchBuffer))
				return
			}
			out <- ev
		}
	}
}

// watchEvents classifies one watch response's etcd events. A release and its
// marker share a revision, and etcd never splits one revision's events
// across responses.
func (s *Store) watchEvents(evs []*clientv3.Event) []store.Event {
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
	var out []store.Event
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
		out = append(out, e)
	}
	for _, ev := range evs {
		key, ok := s.userKey(ev.Kv.Key)
		if !ok {
			if e, ok := s.valueEvent(ev); ok {
				out = append(out, e)
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
				out = append(out, store.Event{Kind: store.EventAcquired, Key: key, Session: g.Session, Token: g.Token})
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
