package check

import (
	"cmp"
	"slices"

	"lock.dev/lockd/test/chaos/history"
)

// Interval is one span in which a process trusted a grant: from the moment
// its acquire reply was received (Start) until it stopped trusting it (End):
// it sent the release, its SDK closed Done() (the lost op's invoke time: the
// SDK's deadline), or it was killed. End is history.Never if none of these
// was recorded. An interval with End <= Start was never trusted (the SDK's
// deadline had passed before the reply arrived).
type Interval struct {
	Key   string
	Proc  string
	Token uint64
	// Mode is the grant's mode (history.Op.Mode of its acquire).
	Mode  string
	Start int64
	End   int64
	// Acquire is the acquire that started the interval.
	Acquire history.Op
	// EndedBy is the op that ended it; its Kind is empty if End is Never.
	EndedBy history.Op
}

// Empty reports whether the grant was never trusted.
func (iv Interval) Empty() bool { return iv.End <= iv.Start }

// TrustIntervals derives the trust interval of every OK acquire in h, sorted
// by key, then Start.
//
// The end of a grant (key, token) of process p is the earliest invoke time
// among p's release and lost ops on the key carrying that token (or no token)
// that complete after the acquire did, and p's crash ops after the acquire.
// A release ends trust when it is sent, whatever its outcome.
func TrustIntervals(h history.History) []Interval {
	type pk struct{ proc, key string }
	enders := map[pk][]history.Op{}
	crashes := map[string][]history.Op{}
	for _, op := range h {
		switch op.Kind {
		case history.Release, history.Lost:
			enders[pk{op.Proc, op.Key}] = append(enders[pk{op.Proc, op.Key}], op)
		case history.Crash:
			crashes[op.Proc] = append(crashes[op.Proc], op)
		}
	}
	var out []Interval
	for _, a := range h {
		if a.Kind != history.Acquire || a.Outcome != history.OK {
			continue
		}
		iv := Interval{Key: a.Key, Proc: a.Proc, Token: a.Token, Mode: a.Mode, Start: a.Complete, End: history.Never, Acquire: a}
		consider := func(e history.Op) {
			if e.Invoke < iv.End {
				iv.End, iv.EndedBy = e.Invoke, e
			}
		}
		for _, e := range enders[pk{a.Proc, a.Key}] {
			if e.Complete >= a.Complete && (e.Token == 0 || e.Token == a.Token) {
				consider(e)
			}
		}
		for _, c := range crashes[a.Proc] {
			if c.Invoke >= a.Complete {
				consider(c)
			}
		}
		out = append(out, iv)
	}
	slices.SortStableFunc(out, func(x, y Interval) int {
		return cmp.Or(cmp.Compare(x.Key, y.Key), cmp.Compare(x.Start, y.Start), cmp.Compare(x.Proc, y.Proc))
	})
	return out
}

// NoTrustedOverlap checks that, per key, the trust intervals (TrustIntervals)
// of different processes never overlap: at no instant did two processes both
// believe they held the key. It counts one violation per overlapping pair.
// Intervals touching at one instant do not overlap. An interval never ended
// (no release, lost or crash recorded) runs to the end of time, so a worker
// should release or record lost before the run stops.
func NoTrustedOverlap(h history.History) Result {
	r := Result{Checker: "no-trusted-overlap"}
	ivs := TrustIntervals(h)
	var active []Interval
	key := ""
	trusted := 0
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
		for _, a := range active {
			if a.Proc == iv.Proc {
				continue
			}
			r.violation("key %q: %s trusted token %d over [%s, %s] (ended by %s) and %s trusted token %d from %s, overlapping for %.3fms",
				iv.Key, a.Proc, a.Token, history.FormatTime(a.Start), history.FormatTime(a.End), endName(a),
				iv.Proc, iv.Token, history.FormatTime(iv.Start), float64(min(a.End, iv.End)-iv.Start)/1e6)
		}
		active = append(active, iv)
	}
	r.note("%d trusted grants, %d grants never trusted", trusted, len(ivs)-trusted)
	return r
}

func endName(iv Interval) string {
	if iv.EndedBy.Kind == "" {
		return "nothing"
	}
	return string(iv.EndedBy.Kind)
}
