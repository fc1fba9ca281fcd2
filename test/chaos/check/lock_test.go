package check

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"lock.dev/lockd/test/chaos/history"
)

// goodHistory exercises every way a key changes hands correctly:
// release, a lost after a pause (observed late, deadline early), a crash,
// a reply delayed past its own deadline, an ambiguous acquire, an ambiguous
// release, a re-acquire of a held key, and failed ops.
func goodHistory(t *testing.T) history.History {
	b := &hb{}
	b.acquire("a", "k", 0, 10, 5).
		acquireFail("c", "k", 5, 30). // gave up while a held
		acquire("a", "k", 12, 14, 5). // a re-acquires: its grant back
		release("a", "k", 50, 52, 5, history.OK).
		acquire("b", "k", 40, 60, 7). // waited, granted after a's release
		lost("b", "k", 7, 100, 300).  // paused: deadline 100, observed at 300
		acquire("c", "k", 90, 150, 9).
		release("b", "k", 301, 305, 7, history.Fail).    // not owner any more
		release("c", "k", 200, 203, 9, history.Unknown). // timed out, in fact applied
		acquire("d", "k", 202, 220, 10).
		crash("d", 260).
		acquireUnknown("e", "k", 230, 240). // timed out, never applied
		acquire("a", "k", 250, 700, 11).    // granted after d's expiry
		lost("a", "k", 11, 650, 700).       // reply arrived after its deadline: never trusted
		acquire("b", "k", 660, 710, 12).
		release("b", "k", 800, 801, 12, history.OK).
		acquire("a", "j", 0, 1, 3). // another key, independent
		release("a", "j", 2, 3, 3, history.OK)
	return b.build(t)
}

func TestLinearizableGood(t *testing.T) {
	wantOK(t, Linearizable(goodHistory(t), LinOptions{}))
}

func TestLinearizableBad(t *testing.T) {
	cases := map[string]*hb{
		"grant while held": (&hb{}).
			acquire("a", "k", 0, 10, 5).
			acquire("b", "k", 20, 30, 7).
			release("a", "k", 40, 41, 5, history.OK),
		"grant before the holder stopped trusting": (&hb{}).
			acquire("a", "k", 0, 10, 5).
			acquire("b", "k", 20, 90, 7).
			lost("a", "k", 5, 100, 100),
		"token goes back": (&hb{}).
			acquire("a", "k", 0, 10, 5).
			release("a", "k", 20, 21, 5, history.OK).
			acquire("b", "k", 30, 40, 3),
		"token reused": (&hb{}).
			acquire("a", "k", 0, 10, 5).
			release("a", "k", 20, 21, 5, history.OK).
			acquire("b", "k", 30, 40, 5),
		"release by a non-holder": (&hb{}).
			acquire("a", "k", 0, 10, 5).
			release("b", "k", 20, 21, 5, history.OK),
		"grant while a crashed holder's ambiguous acquire cannot explain it": (&hb{}).
			acquire("a", "k", 0, 10, 5).
			crash("b", 15).
			acquire("c", "k", 20, 30, 7),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			wantCaught(t, Linearizable(b.build(t), LinOptions{}), 1, `key "k": not linearizable`)
		})
	}
}

func TestLinearizableVisualizes(t *testing.T) {
	dir := t.TempDir()
	h := (&hb{}).acquire("a", "k/x", 0, 10, 5).acquire("b", "k/x", 20, 30, 7).build(t)
	r := Linearizable(h, LinOptions{VisualizeDir: dir})
	wantCaught(t, r, 1, "first op left out: b#2 acquire")
	fi, err := os.Stat(filepath.Join(dir, "lin-k_x.html"))
	if err != nil || fi.Size() == 0 {
		t.Fatalf("visualization file: %v (size %v), want a non-empty file", err, fi)
	}
}

func TestNoTrustedOverlap(t *testing.T) {
	t.Run("good", func(t *testing.T) {
		h := goodHistory(t)
		r := NoTrustedOverlap(h)
		wantOK(t, r)
		// The late reply's interval is empty; b's pause ended trust at
		// its deadline, not at the observation.
		for _, iv := range TrustIntervals(h) {
			if iv.Proc == "a" && iv.Token == 11 && !iv.Empty() {
				t.Fatalf("interval of the late reply = %+v, want empty", iv)
			}
			if iv.Proc == "b" && iv.Token == 7 && (iv.End != 100*ms || iv.EndedBy.Kind != history.Lost) {
				t.Fatalf("interval of b token 7 = %+v, want ended by lost at 100ms", iv)
			}
			if iv.Proc == "d" && iv.EndedBy.Kind != history.Crash {
				t.Fatalf("interval of d = %+v, want ended by its crash", iv)
			}
		}
	})
	t.Run("grant before deadline", func(t *testing.T) {
		h := (&hb{}).acquire("a", "k", 0, 10, 5).lost("a", "k", 5, 100, 300).acquire("b", "k", 20, 90, 7).release("b", "k", 95, 96, 7, history.OK).build(t)
		wantCaught(t, NoTrustedOverlap(h), 1, "a trusted token 5", "b trusted token 7")
	})
	t.Run("never ended", func(t *testing.T) {
		h := (&hb{}).acquire("a", "k", 0, 10, 5).acquire("b", "k", 1000, 1010, 7).release("b", "k", 1020, 1021, 7, history.OK).build(t)
		wantCaught(t, NoTrustedOverlap(h), 1, "ended by nothing")
	})
}

func TestTokensIncrease(t *testing.T) {
	t.Run("good", func(t *testing.T) {
		r := TokensIncrease(goodHistory(t))
		wantOK(t, r)
		// A reply delayed by a pause: b's higher token completes first.
		h := (&hb{}).acquire("a", "k", 0, 300, 5).acquire("b", "k", 100, 150, 6).build(t)
		r = TokensIncrease(h)
		wantOK(t, r)
		if !strings.Contains(strings.Join(r.Notes, " "), "1 out of completion order") {
			t.Fatalf("notes %q do not count the concurrent reordering", r.Notes)
		}
	})
	t.Run("decrease after restart", func(t *testing.T) {
		h := (&hb{}).acquire("a", "k", 0, 10, 500).release("a", "k", 11, 12, 500, history.OK).
			acquire("b", "k", 20, 30, 4).build(t) // e.g. a sequence reset
		wantCaught(t, TokensIncrease(h), 1, "b got token 4")
	})
	t.Run("duplicate", func(t *testing.T) {
		h := (&hb{}).acquire("a", "k", 0, 10, 5).acquire("b", "k", 5, 20, 5).build(t)
		wantCaught(t, TokensIncrease(h), 1, "token 5 granted to a")
	})
}

// mutate returns a copy of h with f applied to every op; f returns false to
// drop the op.
func mutate(h history.History, f func(op *history.Op) bool) history.History {
	var out history.History
	for _, op := range h {
		if f(&op) {
			out = append(out, op)
		}
	}
	out.Sort()
	return out
}

// Each ingredient of the good history is what makes it linearizable: take
// one away and the checkers must object.
func TestGoodHistoryMutationsCaught(t *testing.T) {
	h := goodHistory(t)
	is := func(op *history.Op, proc string, kind history.Kind, token uint64) bool {
		return op.Proc == proc && op.Kind == kind && op.Token == token
	}
	t.Run("ambiguous release made a definite failure", func(t *testing.T) {
		m := mutate(h, func(op *history.Op) bool {
			if is(op, "c", history.Release, 9) {
				op.Outcome = history.Fail
			}
			return true
		})
		wantCaught(t, Linearizable(m, LinOptions{}), 1, "not linearizable")
	})
	t.Run("deadline after the next grant", func(t *testing.T) {
		m := mutate(h, func(op *history.Op) bool {
			if is(op, "b", history.Lost, 7) {
				op.Invoke = 160 * ms
			}
			return true
		})
		wantCaught(t, Linearizable(m, LinOptions{}), 1, "not linearizable")
		wantCaught(t, NoTrustedOverlap(m), 1, "b trusted token 7")
	})
	t.Run("crash not recorded", func(t *testing.T) {
		m := mutate(h, func(op *history.Op) bool { return op.Kind != history.Crash })
		wantCaught(t, Linearizable(m, LinOptions{}), 1, "not linearizable")
		wantCaught(t, NoTrustedOverlap(m), 1, "d trusted token 10")
	})
}
