package server

import (
	"slices"
	"sync"

	"lock.dev/lockd/store"
)

// maxIndexedKeys bounds the cached CheckToken index (C2 #ct2-check-token):
// over it the index starts empty again.
const maxIndexedKeys = 100_000

// tokenIndex is the cached mode of CheckToken (C2 #ct2-check-token): per
// key, the tokens of its current grants, kept current by the server's
// lock-loss watch (lostLoop, notify.go).
//
// A key's tokens come only from a read through the backend (fill): an
// acquired event only drops the key, so its next cached check reads it again
// (on PostgreSQL acquired events are forgeable hints, C2 #ct2-watch).
// Released, expired, revoked and max_hold events remove their token. Every
// event of a key bumps its version, and a read is kept only if the key's
// version did not change while it ran, so a read never overwrites what an
// event delivered during it said. The index answers only while its watch
// runs (live); a broken or resynced watch empties it (gen changes, so reads
// begun before are not kept).
//
// The lostLoop goroutine calls watchUp, watchDown and apply; handlers call
// lookup and fill. mu guards everything.
type tokenIndex struct {
	mu   sync.Mutex
	live bool
	gen  uint64
	keys map[string]*indexedKey
}

// indexedKey is one key of the index. known is false while the key must be
// read (never read, or an acquired event since); ver counts its events.
type indexedKey struct {
	known  bool
	ver    uint64
	tokens []uint64 // sorted
}

// readTicket is what fill needs to decide whether a read may be kept.
type readTicket struct {
	ok  bool // the index was live when the read began
	gen uint64
	ver uint64
}

// watchUp: the lock-loss watch is established; every change from now on is
// delivered to apply.
func (x *tokenIndex) watchUp() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.live = true
	x.gen++
	x.keys = nil
}

// watchDown: the watch broke or resynced (events may have been missed); the
// index forgets everything and answers nothing until watchUp.
func (x *tokenIndex) watchDown() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.live = false
	x.gen++
	x.keys = nil
}

// apply records one event of the watch.
func (x *tokenIndex) apply(ev store.Event) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.live {
		return
	}
	k := x.keys[ev.Key]
	if k == nil {
		return // not indexed, and no read of it under way (lookup adds one)
	}
	k.ver++
	switch ev.Kind {
	case store.EventAcquired:
		k.known = false
		k.tokens = nil
	case store.EventRevoked:
		// A revoke takes every holder of a semaphore or read/write key:
		// read it again rather than trust one event per holder.
		k.known = false
		k.tokens = nil
	case store.EventReleased, store.EventExpired, store.EventMaxHold:
		if i, found := slices.BinarySearch(k.tokens, ev.Token); found {
			k.tokens = slices.Delete(k.tokens, i, i+1)
		}
	}
}

// lookup answers from the index: ok false when the key must be read.
func (x *tokenIndex) lookup(key string) (tokens []uint64, ticket readTicket, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.live {
		return nil, readTicket{}, false
	}
	k := x.keys[key]
	if k != nil && k.known {
		return slices.Clone(k.tokens), readTicket{}, true
	}
	if k == nil {
		// The entry is made now, so events during the read bump its
		// version and the read is not kept.
		if len(x.keys) >= maxIndexedKeys {
			clear(x.keys) // reads under way find no entry and are not kept
		}
		if x.keys == nil {
			x.keys = make(map[string]*indexedKey)
		}
		k = &indexedKey{}
		x.keys[key] = k
	}
	return nil, readTicket{ok: true, gen: x.gen, ver: k.ver}, false
}

// fill keeps the tokens a read (begun after lookup returned ticket) found,
// unless an event of the key or a watch change came in between.
func (x *tokenIndex) fill(key string, ticket readTicket, tokens []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !ticket.ok || !x.live || x.gen != ticket.gen {
		return
	}
	k := x.keys[key]
	if k == nil || k.ver != ticket.ver {
		return
	}
	k.known = true
	k.tokens = slices.Sorted(slices.Values(tokens))
}
