// Package estimate keeps the recent holds of keys and templates and turns
// them into a waiter's wait estimate (docs/contracts/C2.md
// #ct2-wait-estimate). It is fed where the hold statistics are (a grant's
// end) and read by Inspect. Memory is bounded: an LRU of MaxKeys keys and
// one ring per template.
package estimate

import (
	"container/list"
	"slices"
	"sync"
	"time"

	"lock.dev/lockd/server/internal/prefixstats"
)

// Bounds (C2 #ct2-wait-estimate).
const (
	// Ring is how many recent holds a key or template keeps.
	Ring = 8
	// MaxKeys is how many keys the LRU keeps.
	MaxKeys = 4096
	// MaxTemplates is how many templates it keeps (prefixstats'
	// declared or default ones and Other: 33).
	MaxTemplates = prefixstats.MaxTemplates + 1
	// MaxBytes is the memory bound: a 512-byte key plus its rings, last
	// end, map and list entries in 1024 B per key, 256 B per template's
	// two rings.
	MaxBytes = MaxKeys*1024 + MaxTemplates*256
)

// ring is the last Ring holds, newest at next-1.
type ring struct {
	d    [Ring]time.Duration
	n    int // how many are set (≤ Ring)
	next int
}

func (r *ring) add(d time.Duration) {
	r.d[r.next] = d
	r.next = (r.next + 1) % Ring
	r.n = min(r.n+1, Ring)
}

// median is the median of the kept holds (the mean of the middle two of an
// even count); false when none.
func (r *ring) median() (time.Duration, bool) {
	if r.n == 0 {
		return 0, false
	}
	s := make([]time.Duration, r.n)
	copy(s, r.d[:r.n])
	slices.Sort(s)
	if r.n%2 == 1 {
		return s[r.n/2], true
	}
	return (s[r.n/2-1] + s[r.n/2]) / 2, true
}

type entry struct {
	key     string
	holds   ring
	gaps    ring      // hand-overs: a grant's end to the next grant to a waiter
	lastEnd time.Time // the last grant's end not yet followed by a hand-over; zero: none
}

// Holds keeps recent holds. A nil *Holds is valid: it records nothing and
// estimates nothing (the statistics off). Safe for concurrent use.
type Holds struct {
	mu    sync.Mutex
	keys  map[string]*list.Element // of *entry
	lru   list.List                // most recently fed first
	tmpls [MaxTemplates]ring       // holds
	tgaps [MaxTemplates]ring       // hand-overs
	now   func() time.Time
}

// New returns an empty Holds.
func New() *Holds {
	return &Holds{keys: map[string]*list.Element{}, now: time.Now}
}

// Granted records that this lockd answered a grant of key, of template
// tmpl, to an Acquire that waited waited: when the key's last grant ended
// while it waited, the time since that end is a hand-over.
func (h *Holds) Granted(key string, tmpl int, waited time.Duration) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	el, ok := h.keys[key]
	if !ok {
		return
	}
	e := el.Value.(*entry)
	if e.lastEnd.IsZero() {
		return
	}
	gap := max(h.now().Sub(e.lastEnd), 0)
	e.lastEnd = time.Time{}
	if gap > waited { // it came after the end: no hand-over
		return
	}
	e.gaps.add(gap)
	if tmpl >= 0 && tmpl < MaxTemplates {
		h.tgaps[tmpl].add(gap)
	}
}

// Held records that a grant of key, of template tmpl (its index; -1 or out
// of range: none), ended after held.
func (h *Holds) Held(key string, tmpl int, held time.Duration) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if tmpl >= 0 && tmpl < MaxTemplates {
		h.tmpls[tmpl].add(held)
	}
	if el, ok := h.keys[key]; ok {
		e := el.Value.(*entry)
		e.holds.add(held)
		e.lastEnd = h.now()
		h.lru.MoveToFront(el)
		return
	}
	var e *entry
	if h.lru.Len() >= MaxKeys { // reuse the least recently fed entry
		el := h.lru.Back()
		e = el.Value.(*entry)
		delete(h.keys, e.key)
		h.lru.Remove(el)
		*e = entry{}
	} else {
		e = &entry{}
	}
	e.key = key
	e.holds.add(held)
	e.lastEnd = h.now()
	h.keys[key] = h.lru.PushFront(e)
}

// Typical is the typical hold of key: the median of its recent holds, else
// of its template's; false when neither has any. gap is the typical
// hand-over, likewise, 0 when none was seen.
func (h *Holds) Typical(key string, tmpl int) (hold, gap time.Duration, ok bool) {
	if h == nil {
		return 0, 0, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var e *entry
	if el, found := h.keys[key]; found {
		e = el.Value.(*entry)
	}
	inTmpl := tmpl >= 0 && tmpl < MaxTemplates
	if e != nil {
		hold, ok = e.holds.median()
	}
	if !ok && inTmpl {
		hold, ok = h.tmpls[tmpl].median()
	}
	var gok bool
	if e != nil {
		gap, gok = e.gaps.median()
	}
	if !gok && inTmpl {
		gap, _ = h.tgaps[tmpl].median()
	}
	return hold, gap, ok
}

// Len is how many keys are kept.
func (h *Holds) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lru.Len()
}

// Waits estimates the wait of each of waiters waiting behind holders that
// have held the key for elapsed (one per holder), with typical hold typ,
// typical hand-over gap and limit n (0 or 1: a plain lock): position p
// (1 = next) waits r + gap + (p − 1) × (typ + gap) / n, r the least over
// holders of max(typ − e, 0).
func Waits(typ, gap time.Duration, elapsed []time.Duration, n uint32, waiters int) []time.Duration {
	if waiters == 0 {
		return nil
	}
	rem := typ
	for _, e := range elapsed {
		rem = min(rem, max(typ-e, 0))
	}
	rem += gap
	per := (typ + gap) / time.Duration(max(n, 1))
	out := make([]time.Duration, waiters)
	for i := range out {
		out[i] = rem + time.Duration(i)*per
	}
	return out
}
