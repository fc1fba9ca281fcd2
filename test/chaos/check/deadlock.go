package check

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"lock.dev/lockd/test/chaos/history"
)

// DeadlockResult is what DeadlocksResolved found: the result, and figures
// about the cycles it saw.
type DeadlockResult struct {
	Result
	// Cycles counts the two-session cycles of waits found in the history;
	// Refused how many ended with a wait refused as a deadlock (a failed
	// acquire: the pair worker records a DEADLOCK refusal as Fail, a wait
	// timeout as Unknown), Granted how
	// many with a wait granted (the cycle dissolved otherwise), the rest
	// with another failure (a wait timeout) or never.
	Cycles, Refused, Granted int
	// P50 and Max are over the cycles' resolve times: from the cycle's
	// forming (the later of its two waits' invokes) to the first of them
	// to complete.
	P50, Max time.Duration
}

// String renders the result and its figures.
func (r DeadlockResult) String() string {
	return fmt.Sprintf("%s\n  cycles %d: refused %d, granted %d; resolved p50 %v, max %v", r.Result.String(),
		r.Cycles, r.Refused, r.Granted, r.P50, r.Max)
}

// holdingWait is an acquire invoked while its process held other keys.
type holdingWait struct {
	op   history.Op
	held []string
}

// DeadlocksResolved checks C2 #ct2-deadlock on a history whose processes
// take keys while holding others (the deadlock scenario's pairs): every
// two waits that form a cycle — process P, holding a, waits for b while
// process Q, holding b, waits for a — must be resolved within bound: one
// of the two completes (refused with DEADLOCK, granted, or failed
// otherwise) at most bound after the later of their invokes. A cycle that
// neither completes within bound is a violation; so is one that nobody
// resolved before the history ends. Held sets follow each process's own
// operations: an OK acquire holds its key until the process invokes its
// release or crashes (a lost trust does not free the backend's grant).
func DeadlocksResolved(h history.History, bound time.Duration) DeadlockResult {
	res := DeadlockResult{Result: Result{Checker: "deadlock-resolved"}}
	byProc := map[string][]history.Op{}
	for _, op := range h {
		if op.Kind != history.Crash { // the harness's op, in its own sequence: crashAt
			byProc[op.Proc] = append(byProc[op.Proc], op)
		}
	}
	var waits []holdingWait
	for _, ops := range byProc {
		slices.SortFunc(ops, func(a, b history.Op) int { return cmp.Compare(a.Seq, b.Seq) })
		held := map[string]bool{}
		for _, op := range ops {
			switch op.Kind {
			case history.Acquire:
				if len(held) > 0 && !held[op.Key] {
					hs := make([]string, 0, len(held))
					for k := range held {
						hs = append(hs, k)
					}
					slices.Sort(hs)
					waits = append(waits, holdingWait{op: op, held: hs})
				}
				if op.Outcome == history.OK {
					held[op.Key] = true
				}
			case history.Release:
				delete(held, op.Key)
			}
		}
	}
	// Crashes are the harness's ops: a crashed process's holds end then.
	crashAt := map[string]int64{}
	for _, op := range h {
		if op.Kind == history.Crash {
			crashAt[op.Proc] = op.Invoke
		}
	}
	slices.SortFunc(waits, func(a, b holdingWait) int { return cmp.Compare(a.op.Invoke, b.op.Invoke) })
	var times []time.Duration
	for i, a := range waits {
		for _, b := range waits[i+1:] {
			if b.op.Invoke >= a.op.Complete {
				continue // a was over before b began
			}
			if a.op.Proc == b.op.Proc || !slices.Contains(b.held, a.op.Key) || !slices.Contains(a.held, b.op.Key) {
				continue
			}
			if b.op.Invoke >= cmp.Or(crashAt[a.op.Proc], history.Never) || b.op.Invoke >= cmp.Or(crashAt[b.op.Proc], history.Never) {
				continue
			}
			res.Cycles++
			formed := max(a.op.Invoke, b.op.Invoke)
			first := a.op
			if b.op.Complete < a.op.Complete {
				first = b.op
			}
			switch {
			case first.Outcome == history.OK:
				res.Granted++
			case first.Outcome == history.Fail: // the worker's refused wait (a DEADLOCK certainly granted nothing)
				res.Refused++
			}
			if first.Complete == history.Never {
				res.violation("cycle %s waits for %q held by %s, %s waits for %q held by %s: formed at %s, never resolved",
					a.op.Proc, a.op.Key, b.op.Proc, b.op.Proc, b.op.Key, a.op.Proc, history.FormatTime(formed))
				continue
			}
			d := time.Duration(first.Complete - formed)
			times = append(times, d)
			if d > bound {
				res.violation("cycle %s waits for %q held by %s, %s waits for %q held by %s: formed at %s, first answer %v later (%s); bound %v",
					a.op.Proc, a.op.Key, b.op.Proc, b.op.Proc, b.op.Key, a.op.Proc, history.FormatTime(formed), d, first, bound)
			}
		}
	}
	if len(times) > 0 {
		slices.Sort(times)
		res.P50, res.Max = times[(len(times)-1)/2], times[len(times)-1]
	}
	res.Notes = append(res.Notes, fmt.Sprintf("%d cycles of two waits checked against %v", res.Cycles, bound))
	return res
}
