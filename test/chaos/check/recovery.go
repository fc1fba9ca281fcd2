package check

import (
	"fmt"
	"slices"
	"time"

	"lock.dev/lockd/test/chaos/history"
)

// Window is one injected fault, from the run time it began (Start) to the
// run time it ended (End: the partition healed, the process resumed or
// restarted, the quorum restored). A fault that is over at once (a SIGKILL
// of a worker) has Start == End.
type Window struct {
	Fault      string
	Start, End int64
}

// Regrant is what happened to one key after one fault ended: someone wanted
// it from From (the fault's end, or the invoke of the first acquire of it,
// or of a session open made to acquire it, after the end) and it was granted
// again at To (Granted), or was not granted before the history's end (To is
// the horizon).
type Regrant struct {
	Key     string
	Window  Window
	From    int64
	To      int64
	Granted bool
	// Waiter is the process granted the key (Granted), or the first that
	// wanted it.
	Waiter string
	// Interrupted: the next fault began (at To) before the key was granted
	// again; a grant after that is the next fault's re-grant.
	Interrupted bool
}

// Delay is how long the key stayed without a grant after it was wanted.
func (rg Regrant) Delay() time.Duration { return time.Duration(rg.To - rg.From) }

// Regrants derives, for every fault window and every key of h that some
// process wanted after the window ended, when the key was next granted: the
// first OK acquire of the key, by any process, completed after the end. A
// process wants a key while an acquire of it is in flight, and while it
// opens a session to acquire it next (history.Open: one that cannot open a
// session records no acquire at all, yet wants the key); so a want after
// the end is an acquire or open of the key in flight at the end, or invoked
// after it. A key nobody wanted after a fault (the run stopped first) is
// not listed.
//
// A fault's recovery window ends where the next fault begins (the first
// window, other than this one, that starts at or after this one's end):
// a want that begins later is the next fault's, and a key not granted
// again by then is listed Interrupted, To the next fault's start (its
// grant after that is measured from the next fault's end). Without the
// cut, the whole of the next fault counted as this one's recovery.
func Regrants(h history.History, windows []Window) []Regrant {
	horizon := h.Horizon()
	var out []Regrant
	for i, w := range windows {
		cut := nextFault(windows, i)
		for _, key := range h.Keys() {
			rg := Regrant{Key: key, Window: w, From: history.Never, To: history.Never}
			for _, op := range h {
				if (op.Kind != history.Acquire && op.Kind != history.Open) || op.Key != key || op.Complete <= w.End {
					continue
				}
				// Wanted from the end, or from the first later invoke,
				// before the next fault.
				if from := max(w.End, op.Invoke); from < rg.From && from < cut {
					rg.From, rg.Waiter = from, op.Proc
				}
				if op.Kind == history.Acquire && op.Outcome == history.OK && op.Complete < cut &&
					(!rg.Granted || op.Complete < rg.To) {
					rg.To, rg.Granted = op.Complete, true
					rg.Waiter = op.Proc
				}
			}
			switch {
			case rg.From == history.Never:
				continue // nobody wanted the key after the fault
			case !rg.Granted && cut != history.Never:
				rg.To, rg.Interrupted = cut, true
			case !rg.Granted:
				rg.To = max(horizon, rg.From)
			}
			out = append(out, rg)
		}
	}
	return out
}

// nextFault is where the recovery window of windows[i] ends: the earliest
// start, at or after its end, of another window (history.Never if none).
func nextFault(windows []Window, i int) int64 {
	cut := history.Never
	for j, v := range windows {
		if j != i && v.Start >= windows[i].End && v.Start < cut {
			cut = v.Start
		}
	}
	return cut
}

// RecoveryResult is Recovery's Result with the re-grant delay figures.
type RecoveryResult struct {
	Result
	// Bound is the largest acceptable delay.
	Bound time.Duration
	// Granted counts the re-grants; P50, P99 and Max are over their delays
	// (zero if none).
	Granted       int
	P50, P99, Max time.Duration
}

// String renders the result with its figures.
func (r RecoveryResult) String() string {
	return fmt.Sprintf("%s\n  re-grants after faults: %d, p50 %v, p99 %v, max %v, bound %v",
		r.Result.String(), r.Granted, r.P50, r.P99, r.Max, r.Bound)
}

// Recovery checks that the lock service comes back after every fault:
// each key some process wanted after a fault ended (Regrants: an acquire of
// it, or a session open made to acquire it) was granted again within
// bound (TTL + expiry interval + slack: the holders the fault cut off lose
// their sessions within the TTL, the backend frees their keys within the
// expiry interval). It counts a violation for every key granted later, and
// for every key never granted again although the history runs on past the
// bound; a key not granted again when the history ends before the bound has
// run out leaves the result Inconclusive (the runner keeps the workers
// running long enough after the last fault that this does not happen).
// A fault's window ends where the next fault begins (Regrants): a key not
// granted again by then is a violation if the bound had run out, and
// otherwise is judged only as the next fault's re-grant.
//
// It is what makes a run with one acquisition fail: a scenario whose faults
// leave the service unable to grant passes every safety checker.
func Recovery(h history.History, windows []Window, bound time.Duration) RecoveryResult {
	r := RecoveryResult{Result: Result{Checker: "recovery"}, Bound: bound}
	var delays []time.Duration
	undecided, interrupted := 0, 0
	for _, rg := range Regrants(h, windows) {
		d := rg.Delay()
		switch {
		case rg.Interrupted && d > bound:
			r.violation("key %q: fault %s ended at %s; wanted by %s from %s, not granted again in the %v before the next fault began (bound %v)",
				rg.Key, rg.Window.Fault, history.FormatTime(rg.Window.End), rg.Waiter, history.FormatTime(rg.From), d, bound)
		case rg.Interrupted:
			interrupted++
		case rg.Granted && d <= bound:
			delays = append(delays, d)
		case rg.Granted:
			delays = append(delays, d)
			r.violation("key %q: fault %s ended at %s; wanted from %s, granted again to %s only after %v (bound %v)",
				rg.Key, rg.Window.Fault, history.FormatTime(rg.Window.End), history.FormatTime(rg.From), rg.Waiter, d, bound)
		case d > bound:
			r.violation("key %q: fault %s ended at %s; wanted by %s from %s, not granted again in the %v the history runs on (bound %v)",
				rg.Key, rg.Window.Fault, history.FormatTime(rg.Window.End), rg.Waiter, history.FormatTime(rg.From), d, bound)
		default:
			undecided++
		}
	}
	slices.Sort(delays)
	r.Granted = len(delays)
	if len(delays) > 0 {
		r.P50, r.P99, r.Max = percentile(delays, 50), percentile(delays, 99), delays[len(delays)-1]
	}
	if undecided > 0 {
		r.Inconclusive = true
		r.note("%d keys not granted again when the history ended, within the bound of their fault's end", undecided)
	}
	if interrupted > 0 {
		r.note("%d keys not granted again before the next fault began, within the bound of their want (judged after that fault)", interrupted)
	}
	r.note("%d faults, %d re-grants", len(windows), len(delays))
	return r
}
