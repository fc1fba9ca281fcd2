package estimate

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

const ms = time.Millisecond

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		holds []time.Duration
		want  time.Duration
		ok    bool
	}{
		{nil, 0, false},
		{[]time.Duration{5 * ms}, 5 * ms, true},
		{[]time.Duration{9 * ms, 1 * ms, 5 * ms}, 5 * ms, true},
		{[]time.Duration{4 * ms, 2 * ms}, 3 * ms, true},
		// Only the last Ring count: ten 1 s holds then eight 10 ms.
		{append(rep(time.Second, 10), rep(10*ms, 8)...), 10 * ms, true},
	} {
		var r ring
		for _, d := range tc.holds {
			r.add(d)
		}
		got, ok := r.median()
		if got != tc.want || ok != tc.ok {
			t.Errorf("median of %v = %v, %v; want %v, %v", tc.holds, got, ok, tc.want, tc.ok)
		}
	}
}

func rep(d time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

func TestTypicalFallsBackToTemplate(t *testing.T) {
	h := New()
	if _, _, ok := h.Typical("a/1", 0); ok {
		t.Fatal("an estimate with no hold observed; want none")
	}
	h.Held("a/1", 0, 100*ms)
	if d, g, ok := h.Typical("a/1", 0); !ok || d != 100*ms || g != 0 {
		t.Errorf("Typical(a/1) = %v, %v, %v; want 100ms, no hand-over", d, g, ok)
	}
	if d, _, ok := h.Typical("a/2", 0); !ok || d != 100*ms { // the template's
		t.Errorf("Typical(a/2) = %v, %v; want the template's 100ms", d, ok)
	}
	if _, _, ok := h.Typical("b/1", 1); ok {
		t.Error("Typical(b/1) of an unseen template: want none")
	}
	var nilH *Holds
	nilH.Held("a", 0, ms)
	nilH.Granted("a", 0, ms)
	if _, _, ok := nilH.Typical("a", 0); ok {
		t.Error("a nil Holds estimated")
	}
}

// TestHandOver: a grant to an Acquire that waited through the key's last
// end is a hand-over of the time since that end; one that came after the
// end, or a second grant after the same end, is not.
func TestHandOver(t *testing.T) {
	now := time.Unix(1000, 0)
	h := New()
	h.now = func() time.Time { return now }
	h.Held("a/1", 0, 100*ms)
	now = now.Add(30 * ms)
	h.Granted("a/1", 0, time.Second) // waited through the end: 30 ms
	now = now.Add(5 * ms)
	h.Granted("a/1", 0, time.Second) // no end since: nothing
	if _, g, _ := h.Typical("a/1", 0); g != 30*ms {
		t.Errorf("hand-over = %v; want 30ms", g)
	}
	h.Held("a/1", 0, 100*ms)
	now = now.Add(50 * ms)
	h.Granted("a/1", 0, 10*ms) // arrived after the end: not a hand-over
	if _, g, _ := h.Typical("a/1", 0); g != 30*ms {
		t.Errorf("hand-over after a late arrival = %v; want still 30ms", g)
	}
	if _, g, _ := h.Typical("a/2", 0); g != 30*ms {
		t.Errorf("a/2's hand-over = %v; want the template's 30ms", g)
	}
}

func TestWaits(t *testing.T) {
	for _, tc := range []struct {
		name     string
		typ, gap time.Duration
		elapsed  []time.Duration
		n        uint32
		want     []time.Duration
	}{
		{"plain", 100 * ms, 0, []time.Duration{30 * ms}, 0, []time.Duration{70 * ms, 170 * ms, 270 * ms}},
		{"overdue holder", 100 * ms, 0, []time.Duration{300 * ms}, 1, []time.Duration{0, 100 * ms, 200 * ms}},
		{"semaphore of 2", 100 * ms, 0, []time.Duration{90 * ms, 10 * ms}, 2, []time.Duration{10 * ms, 60 * ms, 110 * ms}},
		{"no holder elapsed known", 100 * ms, 0, nil, 0, []time.Duration{100 * ms, 200 * ms, 300 * ms}},
		{"hand-over", 100 * ms, 20 * ms, []time.Duration{30 * ms}, 0, []time.Duration{90 * ms, 210 * ms, 330 * ms}},
	} {
		got := Waits(tc.typ, tc.gap, tc.elapsed, tc.n, len(tc.want))
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: Waits = %v; want %v", tc.name, got, tc.want)
		}
	}
}

func TestLRUBound(t *testing.T) {
	h := New()
	for i := range MaxKeys + 10 {
		h.Held(fmt.Sprint("k/", i), 0, ms)
	}
	if n := h.Len(); n != MaxKeys {
		t.Fatalf("kept %d keys; want the bound %d", n, MaxKeys)
	}
	if _, ok := h.keys["k/0"]; ok {
		t.Error("the least recently fed key was kept")
	}
	if _, ok := h.keys[fmt.Sprint("k/", MaxKeys+9)]; !ok {
		t.Error("the newest key was not kept")
	}
}

func TestMemoryBound(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	h := New()
	for round := range 2 { // the second round evicts every first-round key
		for i := range MaxKeys {
			key := fmt.Sprintf("%d/%d/", round, i)
			key += strings.Repeat("x", 512-len(key))
			for j := range Ring {
				h.Held(key, i%MaxTemplates, time.Duration(j)*ms)
				h.Granted(key, i%MaxTemplates, time.Second)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d keys of 512 bytes hold %d B (bound %d B)", h.Len(), held, MaxBytes)
	if held > MaxBytes {
		t.Errorf("the estimator holds %d B; the bound is %d B", held, MaxBytes)
	}
	if keys := int64(MaxKeys) * 512; held < keys {
		t.Errorf("measured %d B, less than the keys' own %d B: the measure is broken", held, keys)
	}
	runtime.KeepAlive(h)
}
