package check

import (
	"lock.dev/lockd/test/chaos/fenced"
	"lock.dev/lockd/test/chaos/history"
)

// FencedSafety checks the fenced resource's accepted writes (in acceptance
// order, as fenced.Server.Writes returns them): it counts a violation for
// every write accepted with a token lower than one already accepted for its
// key (a stale write: a superseded holder got through), and for every write
// accepted with a token another writer already used on that key (two grants
// with one token, which a ">=" check cannot tell apart).
//
// For a read/write key "already accepted" follows the resource's rules
// (package fenced, Modes): a shared write is stale only below an exclusive
// token accepted before it, an exclusive one below any token. A semaphore
// slot's writes are not judged by token order (no token rule can fence a
// semaphore); TooManyWriters checks them.
//
// With the server's token check on, any violation means the resource or the
// token order is broken. With it off (the control run) violations are
// expected under pauses: they are the writes fencing exists to stop.
func FencedSafety(writes []fenced.Write) Result {
	r := Result{Checker: "fenced-safety"}
	type owner struct {
		writer string
		seq    uint64
	}
	highest := map[string]fenced.Write{} // any mode
	excl := map[string]fenced.Write{}    // exclusive writes only
	tokenOwner := map[string]map[uint64]owner{}
	for _, w := range writes {
		// The write's bar: the highest token of any mode for a plain or
		// exclusive grant, of an exclusive one for a shared grant; a
		// semaphore slot has none (TooManyWriters checks slots).
		bar, barred := highest[w.Key]
		switch w.Mode {
		case fenced.ModeShared:
			bar, barred = excl[w.Key]
		case fenced.ModeSlot:
			barred = false
		}
		if barred && w.Token < bar.Token {
			r.violation("key %q: write #%d by %s with token %d%s accepted after #%d by %s with token %d%s (at %s)",
				w.Key, w.Seq, w.Writer, w.Token, modeNote(w.Mode), bar.Seq, bar.Writer, bar.Token, modeNote(bar.Mode),
				history.FormatTime(w.At))
		}
		if h, ok := highest[w.Key]; !ok || w.Token >= h.Token {
			highest[w.Key] = w
		}
		if x, ok := excl[w.Key]; w.Mode == fenced.ModeExclusive && (!ok || w.Token >= x.Token) {
			excl[w.Key] = w
		}
		owners := tokenOwner[w.Key]
		if owners == nil {
			owners = map[uint64]owner{}
			tokenOwner[w.Key] = owners
		}
		if o, ok := owners[w.Token]; !ok {
			owners[w.Token] = owner{w.Writer, w.Seq}
		} else if o.writer != w.Writer {
			r.violation("key %q: token %d used by %s (write #%d) and by %s (write #%d)",
				w.Key, w.Token, o.writer, o.seq, w.Writer, w.Seq)
		}
	}
	r.note("%d accepted writes on %d keys", len(writes), len(highest))
	return r
}

// OverlappingWriters counts, in the accepted writes, every write by a grant
// (writer, token) that already wrote to the key before another grant's write
// came in between: A, B, A on one key. Such a pattern means two holders both
// acted as the holder over overlapping periods.
//
// It is the control-run checker: with the token check off, a paused holder
// that resumes and writes with its old token shows up here, and the control
// run must find more than zero. With the token check on it stays zero because
// the late write is refused. It needs workers to write at least twice per
// grant (at the start and the end of their critical section), or a resumed
// holder's single late write is caught only by FencedSafety.
func OverlappingWriters(writes []fenced.Write) Result {
	r := Result{Checker: "overlapping-writers"}
	type grant struct {
		writer string
		token  uint64
	}
	last := map[string]grant{}           // key → grant of the previous write
	seen := map[string]map[grant]int64{} // key → grants that wrote → seq of their last write
	for _, w := range writes {
		g := grant{w.Writer, w.Token}
		gs := seen[w.Key]
		if gs == nil {
			gs = map[grant]int64{}
			seen[w.Key] = gs
		}
		if prev, ok := last[w.Key]; ok && prev != g {
			if before, wrote := gs[g]; wrote {
				r.violation("key %q: %s (token %d) wrote at #%d and again at #%d after %s (token %d) wrote in between",
					w.Key, g.writer, g.token, before, w.Seq, prev.writer, prev.token)
			}
		}
		gs[g] = int64(w.Seq)
		last[w.Key] = g
	}
	return r
}

// modeNote renders a write's mode for a violation's details.
func modeNote(mode string) string {
	if mode == "" {
		return ""
	}
	return " (" + mode + ")"
}
