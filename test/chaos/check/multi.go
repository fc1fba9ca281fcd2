package check

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"lock.dev/lockd/test/chaos/fenced"
	"lock.dev/lockd/test/chaos/history"
)

// Kind is what a key is (C2 #ct2-multi): which grants may be held, and may
// act at the fenced resource, at one instant.
type Kind struct {
	// Limit is a semaphore's N: at most N grants at once. 0 or 1 is not a
	// semaphore.
	Limit int
	// RW marks a read/write lock: any number of shared grants, or one
	// exclusive grant alone.
	RW bool
}

// String names the kind for details.
func (k Kind) String() string {
	switch {
	case k.RW:
		return "read/write lock"
	case k.Limit > 1:
		return fmt.Sprintf("semaphore of %d", k.Limit)
	}
	return "plain lock"
}

// admits reports whether grants of these modes may be held together: at
// most Limit of a semaphore; shared ones only, or one grant, of a
// read/write lock (a grant without a mode counts as exclusive); one of a
// plain lock.
func (k Kind) admits(modes []string) bool {
	switch {
	case k.RW:
		return len(modes) <= 1 || !slices.ContainsFunc(modes, func(m string) bool { return m != fenced.ModeShared })
	case k.Limit > 1:
		return len(modes) <= k.Limit
	}
	return len(modes) <= 1
}

// kindOf is kinds[key], a plain lock for a key kinds does not name.
func kindOf(kinds map[string]Kind, key string) Kind { return kinds[key] }

// TooManyTrusted is NoTrustedOverlap for semaphores and read/write locks:
// per key, at no instant did more processes trust a grant than the key's
// kind admits (kinds; a key not named is a plain lock): at most N for a
// semaphore of N, and for a read/write lock never an exclusive grant
// together with any other grant. Trust intervals are TrustIntervals'; the
// mode of each is its acquire's. It counts one violation per interval whose
// start makes the set of trusted grants inadmissible (the largest set of
// overlapping intervals always contains one that starts last), and ignores
// overlaps between intervals of one process.
func TooManyTrusted(h history.History, kinds map[string]Kind) Result {
	r := Result{Checker: "trusted-within-kind"}
	ivs := TrustIntervals(h)
	var active []Interval
	key := ""
	trusted, most := 0, 0
	for _, iv := range ivs {
		if iv.Key != key {
			key, active = iv.Key, active[:0]
		}
		if iv.Empty() {
			continue
		}
		trusted++
		kept := active[:0]
		for _, a := range active {
			if a.End > iv.Start {
				kept = append(kept, a)
			}
		}
		active = kept
		set := []Interval{iv}
		for _, a := range active {
			if a.Proc != iv.Proc {
				set = append(set, a)
			}
		}
		most = max(most, len(set))
		modes := make([]string, len(set))
		for i, x := range set {
			modes[i] = x.Mode
		}
		if k := kindOf(kinds, iv.Key); !k.admits(modes) {
			r.violation("key %q (%s): %s trusted token %d%s from %s while %s",
				iv.Key, k, iv.Proc, iv.Token, modeNote(iv.Mode), history.FormatTime(iv.Start), describeTrusted(set[1:]))
		}
		active = append(active, iv)
	}
	r.note("%d trusted grants, %d grants never trusted, at most %d trusted at once", trusted, len(ivs)-trusted, most)
	return r
}

func describeTrusted(ivs []Interval) string {
	parts := make([]string, len(ivs))
	for i, a := range ivs {
		parts[i] = fmt.Sprintf("%s trusted token %d%s over [%s, %s] (ended by %s)", a.Proc, a.Token, modeNote(a.Mode),
			history.FormatTime(a.Start), history.FormatTime(a.End), endName(a))
	}
	return strings.Join(parts, ", ")
}

// TooManyWriters is OverlappingWriters for semaphores and read/write locks:
// in the fenced resource's accepted writes, a grant (writer, token) acts
// from its first accepted write on a key to its last; per key, at no write
// may more grants act than the key's kind admits (kinds; a key not named
// is a plain lock, for which this is OverlappingWriters' A, B, A). It
// counts one violation per grant whose first write makes the set of acting
// grants inadmissible. Like OverlappingWriters it needs two writes per
// grant, and it is the checker that a resource without a token check (a
// control), or a lock service that admits one holder too many, must fail.
func TooManyWriters(writes []fenced.Write, kinds map[string]Kind) Result {
	r := Result{Checker: "writers-within-kind"}
	type grant struct {
		writer string
		token  uint64
	}
	type span struct {
		first, last uint64
		mode        string
	}
	spans := map[string]map[grant]*span{}
	for _, w := range writes {
		gs := spans[w.Key]
		if gs == nil {
			gs = map[grant]*span{}
			spans[w.Key] = gs
		}
		g := grant{w.Writer, w.Token}
		if sp := gs[g]; sp != nil {
			sp.last = w.Seq
		} else {
			gs[g] = &span{first: w.Seq, last: w.Seq, mode: w.Mode}
		}
	}
	most := 0
	for _, key := range slices.Sorted(maps.Keys(spans)) {
		gs := spans[key]
		k := kindOf(kinds, key)
		order := slices.SortedFunc(maps.Keys(gs), func(a, b grant) int { return cmp.Compare(gs[a].first, gs[b].first) })
		for _, g := range order {
			sp := gs[g]
			modes := []string{sp.mode}
			var others []string
			for _, o := range order {
				if osp := gs[o]; o != g && osp.first < sp.first && osp.last > sp.first {
					modes = append(modes, osp.mode)
					others = append(others, fmt.Sprintf("%s (%s, writes #%d..#%d)", o.writer, tokenMode(o.token, osp.mode),
						osp.first, osp.last))
				}
			}
			most = max(most, len(modes))
			if !k.admits(modes) {
				r.violation("key %q (%s): %s (%s) wrote at #%d while %s still acted", key, k, g.writer,
					tokenMode(g.token, sp.mode), sp.first, strings.Join(others, ", "))
			}
		}
	}
	r.note("%d keys, at most %d grants acting at once", len(spans), most)
	return r
}

// tokenMode renders "token 7" or, with a mode, "token 7, shared".
func tokenMode(token uint64, mode string) string {
	if mode == "" {
		return fmt.Sprintf("token %d", token)
	}
	return fmt.Sprintf("token %d, %s", token, mode)
}
