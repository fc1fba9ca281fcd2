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
	// sw: a semaphore wait of n; rw, rh: a read/write wait and grant.
	sw := func(s, k string, seq int64, n uint32) store.Wait { x := w(s, k, seq); x.Limit = n; return x }
	rw := func(s, k string, seq int64, m store.Mode) store.Wait { x := w(s, k, seq); x.Mode = m; return x }
	rh := func(s, k string, m store.Mode) store.Hold { x := h(s, k); x.Mode = m; return x }
	ex, sh := store.ModeExclusive, store.ModeShared
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
		// The AND-OR model (C2 #ct2-deadlock, 2026-12-07): semaphore and
		// read/write waits.
		{"semaphore, one holder free: no deadlock", store.WaitGraph{
			// W waits for the full semaphore s (T1, T2) and holds x; T1
			// waits for x; T2 waits for nothing and will release its slot.
			Waits: []store.Wait{w("T1", "x", 1), sw("W", "s", 3, 2)},
			Holds: []store.Hold{h("T1", "s"), h("T2", "s"), h("W", "x")},
		}, nil},
		{"semaphore knot: every holder blocked", store.WaitGraph{
			Waits: []store.Wait{w("T1", "x", 1), w("T2", "x", 2), sw("W", "s", 3, 2)},
			Holds: []store.Hold{h("T1", "s"), h("T2", "s"), h("W", "x")},
		}, []want{{"W/s", []string{"s", "x"}}}},
		{"semaphore knot, a waiter queued behind it is not its victim", store.WaitGraph{
			// V queued last for s and holds nothing: it waits for the knot,
			// it is not in it.
			Waits: []store.Wait{w("T1", "x", 1), w("T2", "x", 2), sw("W", "s", 3, 2), sw("V", "s", 9, 2)},
			Holds: []store.Hold{h("T1", "s"), h("T2", "s"), h("W", "x")},
		}, []want{{"W/s", []string{"s", "x"}}}},
		{"semaphore knot closed by a holder's wait", store.WaitGraph{
			Waits: []store.Wait{sw("W", "s", 1, 2), w("T1", "x", 2), w("T2", "x", 9)},
			Holds: []store.Hold{h("T1", "s"), h("T2", "s"), h("W", "x")},
		}, []want{{"T2/x", []string{"s", "x"}}}},
		{"semaphore: the waiter ahead blocked elsewhere, the holders free", store.WaitGraph{
			// X, ahead of W, waits for z, which W holds; H1 and H2 will
			// leave: X is admitted, then W, and W releases z.
			Waits: []store.Wait{sw("X", "s", 1, 2), sw("W", "s", 2, 2), w("X", "z", 3)},
			Holds: []store.Hold{h("H1", "s"), h("H2", "s"), h("W", "z")},
		}, nil},
		{"semaphore: the waiter ahead admitted, then holding W off", store.WaitGraph{
			// H1 leaves and admits X, which then holds a slot and waits
			// for z (W's); H2 waits for x (X's): W never gets a slot.
			Waits: []store.Wait{sw("X", "s", 1, 2), sw("W", "s", 2, 2), w("X", "z", 3), w("H2", "x", 4)},
			Holds: []store.Hold{h("H1", "s"), h("H2", "s"), h("W", "z"), h("X", "x")},
		}, []want{{"H2/x", []string{"s", "x", "z"}}}},
		{"semaphore that is not full: its head is admitted", store.WaitGraph{
			Waits: []store.Wait{sw("W", "s", 2, 3), w("T1", "x", 1)},
			Holds: []store.Hold{h("T1", "s"), h("T2", "s"), h("W", "x")},
		}, nil},
		{"semaphore knot waiting for a plain cycle: only the cycle", store.WaitGraph{
			// W's semaphore wait is freed if T2 is: T2 is in the plain
			// cycle T2-U, whose refusal may end it.
			Waits: []store.Wait{w("T1", "x", 1), w("T2", "y", 2), w("U", "z", 3), sw("W", "s", 5, 2)},
			Holds: []store.Hold{h("T1", "s"), h("T2", "s"), h("W", "x"), h("U", "y"), h("T2", "z")},
		}, []want{{"U/z", []string{"y", "z"}}}},
		{"read/write: a writer waits for every reader", store.WaitGraph{
			// R2 is free, but the writer needs R1 gone too, and R1 waits
			// for a, which the writer holds.
			Waits: []store.Wait{w("R1", "a", 2), rw("W", "rw", 5, ex)},
			Holds: []store.Hold{rh("R1", "rw", sh), rh("R2", "rw", sh), h("W", "a")},
		}, []want{{"W/rw", []string{"a", "rw"}}}},
		{"read/write: a 2-cycle through a shared holder", store.WaitGraph{
			Waits: []store.Wait{w("A", "x", 1), rw("B", "rw", 2, ex)},
			Holds: []store.Hold{rh("A", "rw", sh), h("B", "x")},
		}, []want{{"B/rw", []string{"rw", "x"}}}},
		{"read/write: shared waits do not wait for readers", store.WaitGraph{
			Waits: []store.Wait{w("R1", "a", 1), rw("R2", "rw", 2, sh)},
			Holds: []store.Hold{rh("R1", "rw", sh), h("R2", "a")},
		}, nil},
		{"read/write: a reader queued behind a writer waits for it", store.WaitGraph{
			// X (writer) waits for R1's read; R3 reads behind X; R1
			// waits for k, which R3 holds.
			Waits: []store.Wait{rw("X", "rw", 1, ex), rw("R3", "rw", 2, sh), w("R1", "k", 3)},
			Holds: []store.Hold{rh("R1", "rw", sh), h("R3", "k")},
		}, []want{{"R1/k", []string{"k", "rw"}}}},
		{"read/write: a writer holding it, the shared waiter's cycle", store.WaitGraph{
			Waits: []store.Wait{rw("R", "rw", 1, sh), w("W", "k", 2)},
			Holds: []store.Hold{rh("W", "rw", ex), h("R", "k")},
		}, []want{{"W/k", []string{"k", "rw"}}}},
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
// forming one n-cycle (a deadlock scan's CPU without the backend read), and
// over a knot through a semaphore with n waiters queued.
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
	// One semaphore of 2 whose holders both wait for x, held by the first
	// of n waiters queued for it (a knot; the queue is where a quadratic
	// "every waiter ahead" would show).
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("semaphore-queue/n=%d", n), func(b *testing.B) {
			g := store.WaitGraph{Holds: []store.Hold{{Session: "h1", Key: "s"}, {Session: "h2", Key: "s"}, {Session: "s000000", Key: "x"}}}
			g.Waits = append(g.Waits, store.Wait{Session: "h1", Key: "x", Seq: 0}, store.Wait{Session: "h2", Key: "x", Seq: 1})
			for i := range n {
				g.Waits = append(g.Waits, store.Wait{Session: store.SessionID(fmt.Sprintf("s%06d", i)), Key: "s", Seq: int64(2 + i), Limit: 2})
			}
			for b.Loop() {
				if d := store.FindDeadlocks(g); len(d) != 1 {
					b.Fatalf("%d deadlocks; want 1", len(d))
				}
			}
		})
	}
}
