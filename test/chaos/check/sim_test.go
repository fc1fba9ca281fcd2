package check

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"lock.dev/lockd/test/chaos/history"
)

// simulate produces the history of a correct lock service over several keys
// with the faults of issue 6: releases (some ambiguous), pauses past the
// deadline (lost observed late), kills (crash, in-flight ops never
// complete), replies delayed past their deadline, ambiguous and failed
// acquires, token gaps. Times are in milliseconds before hb scales them.
func simulate(seed uint64, keys, grantsPerKey int) *hb {
	rng := rand.New(rand.NewPCG(seed, 1))
	r := func(lo, hi int64) int64 { return lo + rng.Int64N(hi-lo+1) }
	b := &hb{}
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		procs := []string{}
		for p := range 5 {
			procs = append(procs, fmt.Sprintf("%s-p%d", key, p))
		}
		procFree := map[string]int64{}
		incarnation := map[string]int{}
		name := func(p string) string { return fmt.Sprintf("%s.%d", p, incarnation[p]) }
		var token uint64
		var t int64 // the key is free from t
		for range grantsPerKey {
			p := procs[rng.IntN(len(procs))]
			g := t + r(1, 5) // grant instant on the server
			inv := max(procFree[p], g-r(0, 40))
			if inv > g {
				g = inv + r(1, 3)
			}
			comp := g + r(1, 5)
			token += uint64(r(1, 3))
			holder := name(p)
			// Another process gives up waiting, or times out ambiguously
			// without being granted, while p holds.
			if q := procs[rng.IntN(len(procs))]; q != p && procFree[q] <= g {
				qi := g + r(0, 3)
				if rng.IntN(2) == 0 {
					b.acquireFail(name(q), key, qi, qi+r(1, 5))
				} else {
					b.acquireUnknown(name(q), key, qi, qi+r(1, 5))
				}
				procFree[q] = qi + 6
			}
			switch mode := rng.IntN(10); {
			case mode < 5: // release
				b.acquire(holder, key, inv, comp, token)
				ri := comp + r(1, 20)
				free := ri + r(1, 3)
				out := history.OK
				if mode == 4 {
					out = history.Unknown
				}
				b.release(holder, key, ri, free+r(0, 3), token, out)
				t, procFree[p] = free, free+3
			case mode < 7: // paused past its deadline
				b.acquire(holder, key, inv, comp, token)
				deadline := comp + r(1, 20)
				b.lost(holder, key, token, deadline, deadline+r(0, 300))
				t, procFree[p] = deadline+r(1, 10), deadline+300
			case mode < 9: // killed while holding, a write in flight
				b.acquire(holder, key, inv, comp, token)
				at := comp + r(1, 20)
				b.add(history.Op{Proc: holder, Kind: history.Write, Key: key, Token: token, Invoke: at - 1, Complete: history.Never, Outcome: history.Unknown})
				b.crash(holder, at)
				incarnation[p]++
				t, procFree[p] = at+r(5, 20), at+1
			default: // reply delayed past the deadline
				deadline := g + r(1, 5)
				late := deadline + r(1, 30)
				b.acquire(holder, key, inv, late, token)
				b.lost(holder, key, token, deadline, late)
				t, procFree[p] = deadline+r(1, 5), late
			}
		}
	}
	return b
}

func TestSimulatedHistories(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			h := simulate(seed, 3, 300).build(t)
			start := time.Now()
			wantOK(t, Linearizable(h, LinOptions{Timeout: time.Minute}))
			t.Logf("%d ops linearizable in %v", len(h), time.Since(start))
			wantOK(t, NoTrustedOverlap(h))
			wantOK(t, TokensIncrease(h))

			// Break one grant: make it complete before the previous
			// holder stopped trusting.
			ivs := TrustIntervals(h)
			var victim, prev Interval
			for i := len(ivs) / 2; i < len(ivs); i++ {
				if !ivs[i].Empty() && !ivs[i-1].Empty() && ivs[i].Key == ivs[i-1].Key &&
					ivs[i].Proc != ivs[i-1].Proc && ivs[i-1].End-ivs[i-1].Start > 2*ms {
					victim, prev = ivs[i], ivs[i-1]
					break
				}
			}
			if victim.Key == "" {
				t.Fatal("no grant to break in the simulated history")
			}
			at := prev.Start + (prev.End-prev.Start)/2
			bad := mutate(h, func(op *history.Op) bool {
				if op.Proc == victim.Proc && op.Seq == victim.Acquire.Seq {
					op.Invoke, op.Complete = min(op.Invoke, at-ms), at
				}
				return true
			})
			if r := Linearizable(bad, LinOptions{Timeout: time.Minute}); r.Violations != 1 {
				t.Fatalf("grant of %s moved into %s's trust: want 1 linearizability violation, got\n%s", victim.Proc, prev.Proc, r)
			}
			if r := NoTrustedOverlap(bad); r.Violations == 0 {
				t.Fatalf("grant of %s moved into %s's trust: want an overlap, got\n%s", victim.Proc, prev.Proc, r)
			}
		})
	}
}
