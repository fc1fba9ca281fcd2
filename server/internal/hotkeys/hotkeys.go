// Package hotkeys keeps the hot keys of one lockd process (C4 #ct4-hotkeys,
// C2 #ct2-hotkeys): three Space-Saving top-K sketches — summed wait,
// summed hold, waiting admissions — each in two halves of a sliding
// window, in a stated, bounded memory. A key is never a metric label; the
// HotKeys RPC reads the sketches.
package hotkeys

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"
)

// The sketch's dimensions (C4 #ct4-hotkeys).
const (
	// Slots is the number of keys one half of one sketch tracks.
	Slots = 256
	// Half is the span of one half; a score covers the last Half to
	// Window.
	Half = 30 * time.Second
	// Window is the longest span a score covers.
	Window = 2 * Half
	// DefaultLimit and MaxLimit bound a ranking's answer (C2
	// #ct2-hotkeys).
	DefaultLimit = 10
	MaxLimit     = 50
	// SlotBytes bounds one slot: a key of at most 512 bytes (C2
	// #ct2-keys) plus the slot, its map entry and index.
	SlotBytes = 1536
	// MaxBytes bounds the memory of all sketches: rankings × 2 halves ×
	// Slots × SlotBytes = 2 359 296 B.
	MaxBytes = int(Rankings) * 2 * Slots * SlotBytes
)

// Ranking names one sketch.
type Ranking int

// The rankings.
const (
	ByWait       Ranking = iota // summed wait before a grant, in microseconds
	ByHold                      // summed hold of ended grants, in microseconds
	ByContention                // Acquires admitted to wait
	Rankings                    // the number of rankings
)

// Entry is one key of a ranking: Score may over-estimate the key's true
// total in the window by at most Overcount, never under-estimate it.
type Entry struct {
	Key              string
	Score, Overcount uint64
}

type slot struct {
	key         string
	score, over uint64
}

// half is one half of a sketch: at most Slots keys.
type half struct {
	start time.Time
	idx   map[string]int
	slots []slot
}

func (h *half) reset(start time.Time) {
	h.start = start
	clear(h.idx)
	h.slots = h.slots[:0]
}

// floor is the most an untracked key can have scored in h: the smallest
// score of a full half, else 0.
func (h *half) floor() uint64 {
	if len(h.slots) < Slots {
		return 0
	}
	m := h.slots[0].score
	for _, s := range h.slots[1:] {
		m = min(m, s.score)
	}
	return m
}

// add adds w to key's score (Space-Saving: a new key in a full half takes
// the smallest slot and inherits its score as overcount).
func (h *half) add(key string, w uint64) {
	if i, ok := h.idx[key]; ok {
		h.slots[i].score += w
		return
	}
	if len(h.slots) < Slots {
		k := strings.Clone(key) // one copy, shared by the slot and the map
		h.idx[k] = len(h.slots)
		h.slots = append(h.slots, slot{key: k, score: w})
		return
	}
	m := 0
	for i := 1; i < len(h.slots); i++ {
		if h.slots[i].score < h.slots[m].score {
			m = i
		}
	}
	old := h.slots[m]
	delete(h.idx, old.key)
	k := strings.Clone(key)
	h.idx[k] = m
	h.slots[m] = slot{key: k, score: old.score + w, over: old.score}
}

type sketch struct{ cur, prev half }

// Keys are the hot keys of one server. A nil *Keys records nothing and
// answers nothing. Safe for concurrent use.
type Keys struct {
	now func() time.Time
	mu  sync.Mutex
	sk  [Rankings]sketch
}

// New returns empty sketches on the clock now (nil: time.Now).
func New(now func() time.Time) *Keys {
	if now == nil {
		now = time.Now
	}
	k := &Keys{now: now}
	t := now()
	for i := range k.sk {
		for _, h := range []*half{&k.sk[i].cur, &k.sk[i].prev} {
			h.idx = make(map[string]int, Slots)
			h.slots = make([]slot, 0, Slots)
		}
		k.sk[i].cur.start = t
		k.sk[i].prev.start = t.Add(-Half)
	}
	return k
}

// rotate moves the window of s forward to t (k.mu held).
func (s *sketch) rotate(t time.Time) {
	switch age := t.Sub(s.cur.start); {
	case age < Half:
	case age < Window:
		s.cur, s.prev = s.prev, s.cur
		s.cur.reset(s.prev.start.Add(Half))
	default:
		s.prev.reset(t.Add(-Half))
		s.cur.reset(t)
	}
}

// Waited observes an Acquire's wait for key before its grant.
func (k *Keys) Waited(key string, d time.Duration) { k.observe(ByWait, key, micros(d)) }

// Held observes the hold of an ended grant of key.
func (k *Keys) Held(key string, d time.Duration) { k.observe(ByHold, key, micros(d)) }

// Contended observes an Acquire of key admitted to wait.
func (k *Keys) Contended(key string) { k.observe(ByContention, key, 1) }

func micros(d time.Duration) uint64 { return uint64(max(d.Microseconds(), 0)) }

func (k *Keys) observe(r Ranking, key string, w uint64) {
	if k == nil || w == 0 {
		return
	}
	k.mu.Lock()
	s := &k.sk[r]
	s.rotate(k.now())
	s.cur.add(key, w)
	k.mu.Unlock()
}

// Top returns at most limit keys of ranking r under prefix that allow
// accepts (nil: all), hottest first, ties by key. A key's score over the
// window is its two halves' sum; for a half that does not track it, the
// most an untracked key can have scored there, counted in Overcount too:
// a score never under-estimates.
func (k *Keys) Top(r Ranking, prefix string, allow func(key string) bool, limit int) []Entry {
	if k == nil || limit <= 0 {
		return nil
	}
	k.mu.Lock()
	s := &k.sk[r]
	s.rotate(k.now())
	floors := [2]uint64{s.cur.floor(), s.prev.floor()}
	var out []Entry
	seen := map[string]bool{}
	for hi, h := range []*half{&s.cur, &s.prev} {
		for _, sl := range h.slots {
			if seen[sl.key] || !strings.HasPrefix(sl.key, prefix) {
				continue
			}
			seen[sl.key] = true
			e := Entry{Key: sl.key, Score: sl.score, Overcount: sl.over}
			other := &s.prev
			if hi == 1 {
				other = &s.cur
			}
			if i, ok := other.idx[sl.key]; ok {
				e.Score += other.slots[i].score
				e.Overcount += other.slots[i].over
			} else {
				f := floors[1-hi]
				e.Score += f
				e.Overcount += f
			}
			out = append(out, e)
		}
	}
	k.mu.Unlock()
	if allow != nil {
		out = slices.DeleteFunc(out, func(e Entry) bool { return !allow(e.Key) })
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	return out[:min(len(out), limit)]
}
