package server

import (
	"context"
	"sync"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// maxWatchBatch bounds the events Watch takes from the store's channel at
// once (the store's buffer is of that order).
const maxWatchBatch = 256

// holderReadWidth bounds the concurrent key reads of one batch of a
// Watch with holder.
const holderReadWidth = 8

// nextBatch appends to batch the next event of ch, waiting for it, and then
// every event already queued, up to maxWatchBatch or an event with Err. open
// is false once ch is closed. When idle fires first (nil: never) it returns
// nothing, open.
func nextBatch(ch <-chan store.Event, batch []store.Event, idle <-chan time.Time) (_ []store.Event, open bool) {
	var ev store.Event
	var ok bool
	select {
	case ev, ok = <-ch:
	case <-idle:
		return batch, true
	}
	if !ok {
		return batch, false
	}
	batch = append(batch, ev)
	for len(batch) < maxWatchBatch && ev.Err == nil {
		select {
		case ev, ok = <-ch:
			if !ok {
				return batch, false
			}
			batch = append(batch, ev)
		default:
			return batch, true
		}
	}
	return batch, true
}

// needsHolder reports whether ev is sent with the holder's owner, labels
// and value (C2 #ct2-holder): acquired and value events of a Watch with
// holder, and value events, which only such a Watch gets.
func needsHolder(ev store.Event, holder bool) bool {
	return ev.Err == nil && (ev.Kind == store.EventValue || (holder && ev.Kind == store.EventAcquired))
}

// heldInfo is one read of a key for a batch of watch events.
type heldInfo struct {
	info  store.LockInfo
	found bool
}

// readHolders reads, now, every key of batch that has an event to fill, once
// per key however many of its events are queued, at most holderReadWidth at
// a time. A key's read comes after all of its events in batch arrived, so it
// is what the grant has when they are sent, as C2 #ct2-holder asks.
func (s *Server) readHolders(ctx context.Context, batch []store.Event) (map[string]heldInfo, error) {
	var keys []string
	seen := map[string]bool{}
	for _, ev := range batch {
		if needsHolder(ev, true) && !seen[ev.Key] {
			seen[ev.Key] = true
			keys = append(keys, ev.Key)
		}
	}
	out := make(map[string]heldInfo, len(keys))
	if len(keys) == 1 { // the common case: no goroutine
		info, found, err := s.st.Inspect(ctx, keys[0])
		out[keys[0]] = heldInfo{info, found}
		return out, err
	}
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
		slots = make(chan struct{}, holderReadWidth)
	)
	for _, k := range keys {
		slots <- struct{}{}
		wg.Add(1)
		go func() { // exits when its read returns; waited for below
			defer wg.Done()
			defer func() { <-slots }()
			info, found, err := s.st.Inspect(ctx, k)
			mu.Lock()
			defer mu.Unlock()
			out[k] = heldInfo{info, found}
			if err != nil && first == nil {
				first = err
			}
		}()
	}
	wg.Wait()
	return out, first
}

// fill sets the owner, labels and value of an acquired or value event from
// the read, if the grant it read is still the event's (same session and
// token; for a semaphore or read/write key, one of its holders); current
// reports whether it was.
func (h heldInfo) fill(ev *lockdv1.WatchResponse) (current bool) {
	if !h.found {
		return false
	}
	if h.info.Token == ev.Token && string(h.info.Session) == ev.SessionId {
		ev.Owner, ev.Labels, ev.Value = h.info.Owner, h.info.Labels, h.info.Value
		return true
	}
	for _, hd := range h.info.Holders {
		if hd.Token == ev.Token && string(hd.Session) == ev.SessionId {
			ev.Owner, ev.Labels, ev.Value = hd.Owner, hd.Labels, hd.Value
			return true
		}
	}
	return false
}
