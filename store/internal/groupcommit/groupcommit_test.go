package groupcommit

import (
	"context"
	"errors"
	"slices"
	"testing"

	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

var errClosed = errors.New("closed")

func submit(t *testing.T, q *Queue[int], ctx context.Context, key string, req int) *Job[int] {
	t.Helper()
	j, err := q.Submit(ctx, key, req)
	if err != nil {
		t.Fatalf("Submit(%q, %d): %v", key, req, err)
	}
	return j
}

// TestBatchesInArrivalOrder: a batch takes what is queued in arrival order,
// at most maxSize jobs, each key at most once; a key being run keeps its
// later jobs queued, in place, until Finish frees it.
func TestBatchesInArrivalOrder(t *testing.T) {
	q := New[int](3, errClosed)
	ctx := context.Background()
	for i, k := range []string{"a", "b", "a", "", "", "c"} {
		submit(t, q, ctx, k, i)
	}
	first := q.Next()
	if got := Reqs(first); !slices.Equal(got, []int{0, 1, 3}) {
		t.Fatalf("first batch %v; want [0 1 3] (a once, cap 3)", got)
	}
	second := q.Next() // a and b are busy: 2 waits
	if got := Reqs(second); !slices.Equal(got, []int{4, 5}) {
		t.Fatalf("second batch %v; want [4 5] (a's second job waits for the first)", got)
	}
	if n := q.Queued(); n != 1 {
		t.Fatalf("Queued() = %d; want 1", n)
	}
	q.Finish(first)
	for _, j := range first {
		select {
		case <-j.Done():
		default:
			t.Fatalf("job %d not answered by Finish", j.Req)
		}
	}
	if got := Reqs(q.Next()); !slices.Equal(got, []int{2}) {
		t.Fatalf("third batch %v; want [2] once a is free", got)
	}
}

// TestLoneJobNoLinger: an idle worker takes a lone job at once: Next,
// blocked on an empty queue, returns it as a batch of one.
func TestLoneJobNoLinger(t *testing.T) {
	q := New[int](8, errClosed)
	got := make(chan []*Job[int])
	go func() { got <- q.Next() }() // exits when Next returns (the Submit below)
	submit(t, q, context.Background(), "k", 7)
	if b := <-got; !slices.Equal(Reqs(b), []int{7}) {
		t.Fatalf("batch %v; want [7]", Reqs(b))
	}
}

// TestSubmitAllOneBatch: the jobs of one SubmitAll reach an idle worker as
// one batch, never the first alone (C2 #ct2-heartbeat-many; with Submit per
// job the idle worker takes the first at once, TestLoneJobNoLinger), up to
// the cap; a closed queue queues none of them.
func TestSubmitAllOneBatch(t *testing.T) {
	q := New[int](4, errClosed)
	got := make(chan []*Job[int])
	go func() { got <- q.Next() }() // exits when Next returns (the SubmitAll below)
	jobs, err := q.SubmitAll(context.Background(), "", []int{1, 2, 3, 4, 5})
	if err != nil || len(jobs) != 5 {
		t.Fatalf("SubmitAll = %d jobs, %v; want 5, nil", len(jobs), err)
	}
	if b := <-got; !slices.Equal(Reqs(b), []int{1, 2, 3, 4}) {
		t.Fatalf("batch %v; want [1 2 3 4] (all at once, cap 4)", Reqs(b))
	}
	if b := q.Next(); !slices.Equal(Reqs(b), []int{5}) {
		t.Fatalf("second batch %v; want [5]", Reqs(b))
	}
	q.Close()
	if jobs, err := q.SubmitAll(context.Background(), "", []int{6}); !errors.Is(err, errClosed) || jobs != nil {
		t.Fatalf("SubmitAll after Close = %v, %v; want nil, errClosed", jobs, err)
	}
}

// TestCallerGivesUp: a queued job whose caller gives up is answered with
// its ctx error and never sent; the caller of one whose batch runs waits
// for that batch, and its Wait returns only once Finish answered it, with
// ran true and the batch's result in Req (C2 #ct2-leave-after-cut: before
// issue 21's CUTWAIT-1 fix Wait returned at once, and the caller's cleanup
// could go before the job's own write).
func TestCallerGivesUp(t *testing.T) {
	q := New[int](8, errClosed)
	ctxQ, cancelQ := context.WithCancel(context.Background())
	ctxS, cancelS := context.WithCancel(context.Background())
	defer cancelS()
	s := submit(t, q, ctxS, "s", 1)
	batch := q.Next()
	j := submit(t, q, ctxQ, "q", 2)
	cancelQ()
	if ran, err := q.Wait(ctxQ, j); ran || !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait of a queued job whose ctx ended = %v, %v; want not run, Canceled", ran, err)
	}
	if n := q.Queued(); n != 0 {
		t.Fatalf("Queued() = %d after the caller gave up; want 0", n)
	}
	waiting := make(chan string, 1)
	q.SetSettling(func(key string) { waiting <- key })
	cancelS()
	type waited struct {
		ran bool
		err error
		req int
	}
	got := make(chan waited, 1)
	go func() {
		ran, err := q.Wait(ctxS, s)
		got <- waited{ran, err, s.Req}
	}()
	select {
	case key := <-waiting: // Wait found the job in flight and waits for its batch
		if key != "s" {
			t.Fatalf("settling hook for key %q; want s", key)
		}
	case w := <-got:
		t.Fatalf("Wait of a sent job whose ctx ended returned (%v, %v) before its batch finished; want it to wait", w.ran, w.err)
	}
	s.Req = 10 // the batch's result
	q.Finish(batch)
	if w := <-got; !w.ran || !errors.Is(w.err, context.Canceled) || w.req != 10 {
		t.Fatalf("Wait of a sent job whose ctx ended = %v, %v, result %d; want ran, Canceled, 10", w.ran, w.err, w.req)
	}
}

// TestNextDropsGoneCallers: Next answers and drops a job whose caller's ctx
// ended before it was taken.
func TestNextDropsGoneCallers(t *testing.T) {
	q := New[int](8, errClosed)
	ctx, cancel := context.WithCancel(context.Background())
	gone := submit(t, q, ctx, "a", 1)
	cancel()
	submit(t, q, context.Background(), "b", 2)
	if got := Reqs(q.Next()); !slices.Equal(got, []int{2}) {
		t.Fatalf("batch %v; want [2]", got)
	}
	if inFlight, err := q.Wait(context.Background(), gone); inFlight || !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait of a dropped job = %v, %v; want its ctx error", inFlight, err)
	}
}

// TestWaitAnswered: a job a worker ran is answered with nil and its result.
func TestWaitAnswered(t *testing.T) {
	q := New[int](8, errClosed)
	j := submit(t, q, context.Background(), "k", 1)
	batch := q.Next()
	batch[0].Req = 42
	q.Finish(batch)
	if inFlight, err := q.Wait(context.Background(), j); inFlight || err != nil || j.Req != 42 {
		t.Fatalf("Wait = %v, %v, result %d; want nil and 42", inFlight, err, j.Req)
	}
}

// TestShrink: a refused batch of n halves the cap (never below one).
func TestShrink(t *testing.T) {
	q := New[int](64, errClosed)
	for _, c := range []struct{ n, want int }{{64, 32}, {40, 16}, {3, 1}, {1, 1}} {
		q.Shrink(c.n)
		if q.maxSize != c.want {
			t.Fatalf("Shrink(%d): cap %d; want %d", c.n, q.maxSize, c.want)
		}
	}
	ctx := context.Background()
	submit(t, q, ctx, "a", 1)
	submit(t, q, ctx, "b", 2)
	if got := Reqs(q.Next()); len(got) != 1 {
		t.Fatalf("batch %v after shrinking to 1; want one job", got)
	}
}

// TestClose: Close answers every queued job with the closed error, makes
// Next return nil (also a Next blocked on an empty queue) and refuses
// later Submits; a batch being run still finishes.
func TestClose(t *testing.T) {
	q := New[int](1, errClosed)
	ctx := context.Background()
	running := submit(t, q, ctx, "a", 1)
	batch := q.Next()
	queuedJob := submit(t, q, ctx, "b", 2)
	q.Close()
	if _, err := q.Wait(ctx, queuedJob); !errors.Is(err, errClosed) {
		t.Fatalf("Wait of a job queued at Close = %v; want the closed error", err)
	}
	if b := q.Next(); b != nil {
		t.Fatalf("Next after Close = %v; want nil", Reqs(b))
	}
	if _, err := q.Submit(ctx, "c", 3); !errors.Is(err, errClosed) {
		t.Fatalf("Submit after Close = %v; want the closed error", err)
	}
	q.Finish(batch)
	if _, err := q.Wait(ctx, running); err != nil {
		t.Fatalf("Wait of the batch run across Close = %v; want nil", err)
	}

	q2 := New[int](1, errClosed)
	got := make(chan []*Job[int])
	go func() { got <- q2.Next() }() // exits when Close wakes it
	q2.Close()
	if b := <-got; b != nil {
		t.Fatalf("a Next blocked at Close returned %v; want nil", Reqs(b))
	}
}

// TestSettle: Settle waits until the key's job in flight (its caller gone
// and still waiting for it) and the key's queued jobs are answered; not for
// another key's, nor for jobs submitted after it looked; it returns ctx's
// error when ctx ends first.
func TestSettle(t *testing.T) {
	q := New[int](8, errClosed)
	if err := q.Settle(context.Background(), "k"); err != nil {
		t.Fatalf("Settle of an idle key: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cut := submit(t, q, ctx, "k", 1)
	submit(t, q, context.Background(), "o", 2)
	first := q.Next() // 1 and 2 are sent
	submit(t, q, context.Background(), "k", 3)
	cancel()
	waiting := make(chan struct{}, 2)
	q.SetSettling(func(key string) {
		if key == "k" {
			waiting <- struct{}{}
		}
	})
	cutRan := make(chan bool, 1)
	go func() { // the cut caller: waits for its job's batch
		ran, _ := q.Wait(ctx, cut)
		cutRan <- ran
	}()
	<-waiting
	settled := make(chan error, 1)
	go func() { settled <- q.Settle(context.Background(), "k") }() // returns once job 3 is answered
	<-waiting
	late := submit(t, q, context.Background(), "k", 4) // after Settle looked: not waited for
	q.Finish(first)
	if !<-cutRan {
		t.Fatal("the cut job's Wait = not run; want ran (its batch ran)")
	}
	second := q.Next()
	if got := Reqs(second); !slices.Equal(got, []int{3}) {
		t.Fatalf("second batch %v; want [3]", got)
	}
	select {
	case err := <-settled:
		t.Fatalf("Settle returned (%v) with job 3 of its key still in flight", err)
	default:
	}
	q.Finish(second)
	if err := <-settled; err != nil {
		t.Fatalf("Settle: %v", err)
	}
	select {
	case <-late.Done():
		t.Fatal("job 4 answered without a batch")
	default:
	}
	third := q.Next() // 4
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := q.Settle(ctx2, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Settle with its ctx ended and job 4 in flight = %v; want Canceled", err)
	}
	q.Finish(third)
	if err := q.Settle(context.Background(), "o"); err != nil {
		t.Fatalf("Settle of a key whose jobs are done: %v", err)
	}
}
