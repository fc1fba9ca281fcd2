package store_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"lock.dev/lockd/store"
)

func TestFindDeadlocks(t *testing.T) {
	w := func(s, k string, seq int64) store.Wait {
		return store.Wait{Session: store.SessionID(s), Key: k, Seq: seq}
	}
	off := func(x store.Wait) store.Wait { x.NoCheck = true; return x }
	h := func(s, k string) store.Hold { return store.Hold{Session: store.SessionID(s), Key: k} }
	type want struct {
		victim string // "session/key"
		keys   []string
	}
	for _, tc := range []struct {
		name string
		g    store.WaitGraph
		want []want
	}{
		{"none", store.WaitGraph{}, nil},
		{"chain, no cycle", store.WaitGraph{
			Waits: []store.Wait{w("A", "b", 1), w("B", "c", 2)},
			Holds: []store.Hold{h("A", "a"), h("B", "b"), h("C", "c")},
		}, nil},
		{"two-cycle: the youngest wait", store.WaitGraph{
			Waits: []store.Wait{w("A", "b", 5), w("B", "a", 7)},
			Holds: []store.Hold{h("A", "a"), h("B", "b")},
		}, []want{{"B/a", []string{"a", "b"}}}},
		{"two-cycle, the youngest opted out", store.WaitGraph{
			Waits: []store.Wait{w("A", "b", 5), off(w("B", "a", 7))},
			Holds: []store.Hold{h("A", "a"), h("B", "b")},
		}, []want{{"A/b", []string{"a", "b"}}}},
		{"two-cycle, both opted out", store.WaitGraph{
			Waits: []store.Wait{off(w("A", "b", 5)), off(w("B", "a", 7))},
			Holds: []store.Hold{h("A", "a"), h("B", "b")},
		}, nil},
		{"three-cycle with a tail and a bystander", store.WaitGraph{
			Waits: []store.Wait{w("A", "b", 3), w("B", "c", 9), w("C", "a", 4), w("D", "a", 10), w("E", "z", 11)},
			Holds: []store.Hold{h("A", "a"), h("B", "b"), h("C", "c"), h("D", "d")},
		}, []want{{"B/c", []string{"a", "b", "c"}}}},
		{"a session waiting for its own key is no cycle", store.WaitGraph{
			Waits: []store.Wait{w("A", "a", 1)},
			Holds: []store.Hold{h("A", "a")},
		}, nil},
		{"two separate cycles", store.WaitGraph{
			Waits: []store.Wait{w("A", "b", 1), w("B", "a", 2), w("C", "d", 4), w("D", "c", 3)},
			Holds: []store.Hold{h("A", "a"), h("B", "b"), h("C", "c"), h("D", "d")},
		}, []want{{"B/a", []string{"a", "b"}}, {"C/d", []string{"c", "d"}}}},
		{"a wait outside the component is not its victim", store.WaitGraph{
			// B also waits for x, held by X outside the cycle, queued last.
			Waits: []store.Wait{w("A", "b", 1), w("B", "a", 2), w("B", "x", 99)},
			Holds: []store.Hold{h("A", "a"), h("B", "b"), h("X", "x")},
		}, []want{{"B/a", []string{"a", "b"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := store.FindDeadlocks(tc.g)
			if len(got) != len(tc.want) {
				t.Fatalf("FindDeadlocks = %+v; want %d deadlocks %+v", got, len(tc.want), tc.want)
			}
			for i, d := range got {
				if v := string(d.Victim.Session) + "/" + d.Victim.Key; v != tc.want[i].victim || !slices.Equal(d.Keys, tc.want[i].keys) {
					t.Errorf("deadlock %d: victim %s keys %v; want %s %v", i, v, d.Keys, tc.want[i].victim, tc.want[i].keys)
				}
			}
			// The same graph in another order gives the same answer.
			r := rand.New(rand.NewPCG(1, 2))
			for range 20 {
				g := store.WaitGraph{Waits: slices.Clone(tc.g.Waits), Holds: slices.Clone(tc.g.Holds)}
				r.Shuffle(len(g.Waits), func(i, j int) { g.Waits[i], g.Waits[j] = g.Waits[j], g.Waits[i] })
				r.Shuffle(len(g.Holds), func(i, j int) { g.Holds[i], g.Holds[j] = g.Holds[j], g.Holds[i] })
				if again := store.FindDeadlocks(g); fmt.Sprint(again) != fmt.Sprint(got) {
					t.Fatalf("shuffled: %+v; want %+v", again, got)
				}
			}
		})
	}
}

// TestFindDeadlocksNCycle: a cycle of n sessions (a long chain; the walk is
// iterative) is one deadlock whose victim is the youngest wait.
func TestFindDeadlocksNCycle(t *testing.T) {
	const n = 10000
	var g store.WaitGraph
	for i := range n {
		s := store.SessionID(fmt.Sprintf("s%06d", i))
		g.Holds = append(g.Holds, store.Hold{Session: s, Key: fmt.Sprintf("k%06d", i)})
		g.Waits = append(g.Waits, store.Wait{Session: s, Key: fmt.Sprintf("k%06d", (i+1)%n), Seq: int64((i * 7919) % n)})
	}
	got := store.FindDeadlocks(g)
	if len(got) != 1 || len(got[0].Keys) != n || got[0].Victim.Seq != n-1 {
		t.Fatalf("got %d deadlocks (first: %d keys, victim seq %d); want 1 with %d keys, victim seq %d",
			len(got), len(got[0].Keys), got[0].Victim.Seq, n, n-1)
	}
	// Break one edge: no cycle.
	g.Waits = g.Waits[1:]
	if got := store.FindDeadlocks(g); len(got) != 0 {
		t.Fatalf("chain: %d deadlocks; want none", len(got))
	}
}

func TestDeadlockError(t *testing.T) {
	var err error = fmt.Errorf("acquire: %w", &store.DeadlockError{Keys: []string{"a", "b"}})
	var de *store.DeadlockError
	if !errors.Is(err, store.ErrDeadlock) || !errors.As(err, &de) || !slices.Equal(de.Keys, []string{"a", "b"}) {
		t.Fatalf("%v: Is %v, As %v", err, errors.Is(err, store.ErrDeadlock), de)
	}
	if store.IsRetryable(err) {
		t.Fatal("a deadlock is retryable")
	}
	o, err := store.NewAcquireOptions(store.NoDeadlockCheck())
	if err != nil || !o.NoDeadlockCheck {
		t.Fatalf("NoDeadlockCheck: %+v, %v", o, err)
	}
}

// BenchmarkFindDeadlocks is FindDeadlocks alone over n grants and n waits
// forming one n-cycle (a deadlock scan's CPU without the backend read).
//
//	go test -run '^$' -bench FindDeadlocks ./store/
func BenchmarkFindDeadlocks(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			var g store.WaitGraph
			for i := range n {
				s := store.SessionID(fmt.Sprintf("s%06d", i))
				g.Holds = append(g.Holds, store.Hold{Session: s, Key: fmt.Sprintf("k%06d", i)})
				g.Waits = append(g.Waits, store.Wait{Session: s, Key: fmt.Sprintf("k%06d", (i+1)%n), Seq: int64(i)})
			}
			for b.Loop() {
				if d := store.FindDeadlocks(g); len(d) != 1 {
					b.Fatalf("%d deadlocks; want 1", len(d))
				}
			}
		})
	}
}
