package check

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"lock.dev/lockd/test/chaos/history"
)

// Death is a holder that stopped for good (SIGKILL) or for longer than its
// TTL (SIGSTOP), at run time At. The runner knows these; a history's crash
// ops are deaths too (DeathsOf).
type Death struct {
	Proc string
	At   int64
	// Until is when a pause ended (SIGCONT); zero for a crash or when not
	// known. Only PausesHitHolders reads it.
	Until int64
}

// DeathsOf returns the crash ops of h as deaths.
func DeathsOf(h history.History) []Death {
	var ds []Death
	for _, op := range h {
		if op.Kind == history.Crash {
			ds = append(ds, Death{Proc: op.Proc, At: op.Invoke})
		}
	}
	return ds
}

// HandOver is what happened to a key after its holder died: the next process
// that was waiting for it, from when it waited (the later of the death and its
// acquire's invoke) to when it was granted the key, or to when it gave up
// (Granted false: its acquire failed or never completed).
type HandOver struct {
	Key     string
	Holder  string
	Died    int64
	Waiter  string
	From    int64
	To      int64
	Granted bool
}

// Delay is how long the waiter waited for the dead holder's key.
func (ho HandOver) Delay() time.Duration { return time.Duration(ho.To - ho.From) }

// HandOvers derives, for every death, the keys the dead process held at that
// instant (its trust interval contains it, TrustIntervals) and, per key, the
// first grant of the key to another process completed after the death; and
// every other process's acquire of the key that was waiting after the death
// and ended without a grant before that first one (a waiter that gave up, or
// never got an answer: its wait runs to the end of the history, or to its own
// crash).
func HandOvers(h history.History, deaths []Death) []HandOver {
	ivs := TrustIntervals(h)
	horizon := h.Horizon()
	crashes := map[string][]int64{}
	for _, d := range DeathsOf(h) {
		crashes[d.Proc] = append(crashes[d.Proc], d.At)
	}
	var out []HandOver
	for _, d := range deaths {
		for _, iv := range ivs {
			if iv.Proc != d.Proc || iv.Start > d.At || iv.End < d.At {
				continue
			}
			var next *history.Op
			for i := range h {
				op := &h[i]
				if op.Kind == history.Acquire && op.Outcome == history.OK && op.Key == iv.Key &&
					op.Proc != d.Proc && op.Complete > d.At && (next == nil || op.Complete < next.Complete) {
					next = op
				}
			}
			if next != nil {
				out = append(out, HandOver{Key: iv.Key, Holder: d.Proc, Died: d.At, Waiter: next.Proc,
					From: max(d.At, next.Invoke), To: next.Complete, Granted: true})
			}
			for _, op := range h {
				if op.Kind != history.Acquire || op.Outcome == history.OK || op.Key != iv.Key || op.Proc == d.Proc {
					continue
				}
				end := op.Complete
				if end == history.Never {
					end = horizon
					for _, c := range crashes[op.Proc] { // the waiter itself was killed
						if c >= op.Invoke {
							end = min(end, c)
						}
					}
				}
				if end <= d.At || (next != nil && op.Invoke >= next.Complete) {
					continue
				}
				out = append(out, HandOver{Key: iv.Key, Holder: d.Proc, Died: d.At, Waiter: op.Proc,
					From: max(d.At, op.Invoke), To: end})
			}
		}
	}
	slices.SortStableFunc(out, func(a, b HandOver) int {
		return cmp.Or(cmp.Compare(a.Died, b.Died), cmp.Compare(a.Key, b.Key), cmp.Compare(a.From, b.From))
	})
	return out
}

// LivenessResult is Liveness's Result with the hand-over delay figures.
type LivenessResult struct {
	Result
	// Bound is the largest acceptable delay.
	Bound time.Duration
	// Granted counts the hand-overs that ended in a grant; P50, P99 and Max
	// are over their delays (zero if none).
	Granted       int
	P50, P99, Max time.Duration
}

// String renders the result with its figures.
func (r LivenessResult) String() string {
	return fmt.Sprintf("%s\n  hand-overs: %d granted, p50 %v, p99 %v, max %v, bound %v",
		r.Result.String(), r.Granted, r.P50, r.P99, r.Max, r.Bound)
}

// LivenessBound is the bound of issue 6: after a holder dies, the next waiter
// is granted within TTL + reaper interval + slack.
func LivenessBound(ttl, reaperInterval, slack time.Duration) time.Duration {
	return ttl + reaperInterval + slack
}

// Liveness reports the percentiles of the granted hand-overs' delays and
// counts a violation for every hand-over, granted or not, whose delay
// exceeds bound: a waiter kept out of a dead holder's key for longer than the
// backend's expiry allows.
func Liveness(hos []HandOver, bound time.Duration) LivenessResult {
	r := LivenessResult{Result: Result{Checker: "liveness"}, Bound: bound}
	var delays []time.Duration
	for _, ho := range hos {
		d := ho.Delay()
		if ho.Granted {
			delays = append(delays, d)
		}
		if d > bound {
			what := "granted"
			if !ho.Granted {
				what = "still not granted"
			}
			r.violation("key %q: %s died at %s; %s waited from %s and was %s after %v (bound %v)",
				ho.Key, ho.Holder, history.FormatTime(ho.Died), ho.Waiter, history.FormatTime(ho.From), what, d, bound)
		}
	}
	slices.Sort(delays)
	r.Granted = len(delays)
	if len(delays) > 0 {
		r.P50, r.P99, r.Max = percentile(delays, 50), percentile(delays, 99), delays[len(delays)-1]
	}
	r.note("%d hand-overs, %d granted", len(hos), len(delays))
	return r
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []time.Duration, p int) time.Duration {
	rank := (p*len(sorted) + 99) / 100 // ceil(p/100 · n)
	return sorted[max(rank, 1)-1]
}
