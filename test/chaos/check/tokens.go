package check

import (
	"cmp"
	"maps"
	"slices"

	"lock.dev/lockd/test/chaos/history"
)

// TokensIncrease checks the fencing tokens of every OK acquire in h, per key:
//
//   - no two processes were granted the same token (equal tokens for
//     different grants: a ">=" fenced resource could not tell them apart);
//   - a grant whose acquire was invoked after another grant's acquire had
//     completed carries a strictly higher token (real-time order: the second
//     grant certainly happened after the first).
//
// Grants whose acquires overlapped in time may carry tokens in either order,
// and so may a grant whose reply reached its process late (a pause between
// the grant and the reply): completion order is not grant order. Such
// reorderings are counted in a note, not as violations. A process
// re-acquiring a key it holds gets its grant back with the same token; that
// is one grant, not two.
func TokensIncrease(h history.History) Result {
	r := Result{Checker: "tokens-increase"}
	type grant struct {
		proc  string
		token uint64
	}
	byKey := map[string][]history.Op{}
	for _, op := range h {
		if op.Kind == history.Acquire && op.Outcome == history.OK {
			byKey[op.Key] = append(byKey[op.Key], op)
		}
	}
	total, reordered := 0, 0
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		// One op per grant: the earliest completing of a process's
		// acquires returning one token.
		var grants []history.Op
		seen := map[grant]bool{}
		owner := map[uint64]history.Op{}
		ops := byKey[key]
		slices.SortStableFunc(ops, func(a, b history.Op) int { return cmp.Compare(a.Complete, b.Complete) })
		for _, op := range ops {
			g := grant{op.Proc, op.Token}
			if seen[g] {
				continue
			}
			seen[g] = true
			grants = append(grants, op)
			if o, ok := owner[op.Token]; ok {
				r.violation("key %q: token %d granted to %s (%v) and to %s (%v)", key, op.Token, o.Proc, o, op.Proc, op)
			} else {
				owner[op.Token] = op
			}
		}
		total += len(grants)
		// Real-time order: sweep grants by invoke, folding in every grant
		// that completed strictly before.
		byInvoke := slices.Clone(grants)
		slices.SortStableFunc(byInvoke, func(a, b history.Op) int { return cmp.Compare(a.Invoke, b.Invoke) })
		var best history.Op // highest token among grants completed so far
		done := 0
		for _, y := range byInvoke {
			for done < len(grants) && grants[done].Complete < y.Invoke {
				if grants[done].Token > best.Token {
					best = grants[done]
				}
				done++
			}
			if best.Token != 0 && y.Token < best.Token {
				r.violation("key %q: %s got token %d (%v) after %s had already been granted token %d (%v)",
					key, y.Proc, y.Token, y, best.Proc, best.Token, best)
			}
		}
		var maxSoFar uint64
		for _, g := range grants {
			if g.Token < maxSoFar {
				reordered++
			}
			maxSoFar = max(maxSoFar, g.Token)
		}
	}
	r.note("%d grants on %d keys; %d out of completion order (those not listed as violations were concurrent with the higher grant)",
		total, len(byKey), reordered)
	return r
}
