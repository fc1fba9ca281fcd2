package deadlock_test

import (
	"context"
	"slices"
	"testing"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/internal/deadlock"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

var (
	cycle = store.WaitGraph{
		Waits: []store.Wait{{Session: "A", Key: "b", Seq: 1}, {Session: "B", Key: "a", Seq: 2}},
		Holds: []store.Hold{{Session: "A", Key: "a"}, {Session: "B", Key: "b"}},
	}
	// dissolved: A released a, so B is no longer waiting for A.
	dissolved = store.WaitGraph{
		Waits: []store.Wait{{Session: "A", Key: "b", Seq: 1}, {Session: "B", Key: "a", Seq: 2}},
		Holds: []store.Hold{{Session: "B", Key: "b"}},
	}
	// requeued: B left and queued again for a (a new place).
	requeued = store.WaitGraph{
		Waits: []store.Wait{{Session: "A", Key: "b", Seq: 1}, {Session: "B", Key: "a", Seq: 3}},
		Holds: cycle.Holds,
	}
)

// scans runs one scan per graph, with B's wait on a registered, and returns
// how many calls each scan refused.
func scans(t *testing.T, graphs ...store.WaitGraph) ([]int, *deadlock.Wait) {
	t.Helper()
	i := 0
	d := deadlock.New(func(context.Context) (store.WaitGraph, error) { g := graphs[i]; i++; return g, nil })
	w := d.Register("B", "a", nil)
	t.Cleanup(w.Done)
	var got []int
	for range graphs {
		n, err := d.Scan(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, n)
	}
	return got, w
}

// TestDeadlockStaleCycleNotRefused: a cycle seen by one scan and gone at
// the next (it dissolved before detection) is not refused, nor is a cycle
// whose victim's place changed between the scans; the control, the same
// cycle in two consecutive scans, is.
func TestDeadlockStaleCycleNotRefused(t *testing.T) {
	if got, w := scans(t, cycle, dissolved, cycle); !slices.Equal(got, []int{0, 0, 0}) || w.Err() != nil {
		t.Errorf("cycle, dissolved, cycle: refused %v (%v); want none", got, w.Err())
	}
	if got, w := scans(t, cycle, requeued); !slices.Equal(got, []int{0, 0}) || w.Err() != nil {
		t.Errorf("cycle, cycle with a new place: refused %v (%v); want none", got, w.Err())
	}
	// Control: the same cycle twice is refused at the second scan.
	got, w := scans(t, cycle, cycle)
	if !slices.Equal(got, []int{0, 1}) || w.Err() == nil || !slices.Equal(w.Err().Keys, []string{"a", "b"}) {
		t.Fatalf("control: refused %v (%v); want [0 1] with keys [a b]", got, w.Err())
	}
	select {
	case <-w.Refused():
	default:
		t.Fatal("control: Refused not closed")
	}
}

// TestOnlyLocalVictims: a victim this instance does not run is left to
// the instance that does; an idle detector reads nothing.
func TestOnlyLocalVictims(t *testing.T) {
	reads := 0
	d := deadlock.New(func(context.Context) (store.WaitGraph, error) { reads++; return cycle, nil })
	if n, _ := d.Scan(context.Background()); n != 0 || reads != 0 {
		t.Fatalf("idle scan: refused %d, read %d times; want 0, 0", n, reads)
	}
	w := d.Register("A", "b", nil) // A's wait is not the victim (B's is younger)
	defer w.Done()
	for range 3 {
		if n, _ := d.Scan(context.Background()); n != 0 {
			t.Fatalf("refused %d; want 0 (the victim is another instance's)", n)
		}
	}
	if reads != 3 || w.Err() != nil {
		t.Fatalf("reads %d, err %v; want 3, nil", reads, w.Err())
	}
}
