package check

import (
	"testing"
	"time"

	"lock.dev/lockd/test/chaos/history"
)

func TestHandOversAndLiveness(t *testing.T) {
	// a holds k and is killed at 100; b waits from 50 and is granted at
	// 1100 (a's session expired); c waits from 300, gives up at 400 (short
	// timeout, not a liveness failure). e holds j and is paused at 200;
	// f is granted j at 1700.
	b := &hb{}
	b.acquire("a", "k", 0, 10, 5).
		acquire("b", "k", 50, 1100, 6).
		acquireFail("c", "k", 300, 400).
		crash("a", 100).
		acquire("e", "j", 0, 10, 3).
		lost("e", "j", 3, 900, 5000).
		acquire("f", "j", 100, 1700, 4)
	h := b.build(t)
	deaths := append(DeathsOf(h), Death{Proc: "e", At: 200 * ms})
	hos := HandOvers(h, deaths)
	want := []HandOver{
		{Key: "k", Holder: "a", Died: 100 * ms, Waiter: "b", From: 100 * ms, To: 1100 * ms, Granted: true},
		{Key: "k", Holder: "a", Died: 100 * ms, Waiter: "c", From: 300 * ms, To: 400 * ms},
		{Key: "j", Holder: "e", Died: 200 * ms, Waiter: "f", From: 200 * ms, To: 1700 * ms, Granted: true},
	}
	if len(hos) != len(want) {
		t.Fatalf("HandOvers = %+v, want %+v", hos, want)
	}
	for i := range want {
		if hos[i] != want[i] {
			t.Fatalf("HandOvers[%d] = %+v, want %+v", i, hos[i], want[i])
		}
	}

	good := Liveness(hos, 1600*time.Millisecond)
	wantOK(t, good.Result)
	if good.Granted != 2 || good.P50 != time.Second || good.Max != 1500*time.Millisecond || good.P99 != 1500*time.Millisecond {
		t.Fatalf("Liveness figures = %+v, want 2 granted, p50 1s, p99 = max = 1.5s", good)
	}
	bad := Liveness(hos, 1200*time.Millisecond)
	wantCaught(t, bad.Result, 1, `key "j": e died`, "granted after 1.5s")
}

func TestLivenessWaiterNeverGranted(t *testing.T) {
	// a is killed holding k; b's acquire never completes (the key is never
	// freed): its wait runs to the end of the history and breaks the bound.
	b := &hb{}
	b.acquire("a", "k", 0, 10, 5).
		crash("a", 100).
		add(history.Op{Proc: "b", Kind: history.Acquire, Key: "k", Invoke: 50, Complete: history.Never, Outcome: history.Unknown}).
		acquire("z", "other", 0, 5000, 1)
	h := b.build(t)
	r := Liveness(HandOvers(h, DeathsOf(h)), 2*time.Second)
	wantCaught(t, r.Result, 1, "still not granted after 4.9s")
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    int
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {1, time.Millisecond}} {
		if got := percentile(ds, c.p); got != c.want {
			t.Errorf("percentile(1..100ms, %d) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile(ds[:1], 99); got != time.Millisecond {
		t.Errorf("percentile of one value = %v, want it", got)
	}
}

func TestResultDetailsCapped(t *testing.T) {
	r := Result{Checker: "x"}
	for i := range MaxDetails + 5 {
		r.violation("v%d", i)
	}
	if r.Violations != MaxDetails+5 || len(r.Details) != MaxDetails+1 || r.Details[MaxDetails] != "... and 5 more" {
		t.Fatalf("after %d violations: count %d, %d details, last %q", MaxDetails+5, r.Violations, len(r.Details), r.Details[len(r.Details)-1])
	}
	if r.OK() {
		t.Fatal("OK() with violations = true")
	}
	if (Result{Inconclusive: true}).OK() {
		t.Fatal("OK() of an inconclusive result = true")
	}
}
