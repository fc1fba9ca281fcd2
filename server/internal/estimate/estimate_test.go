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
	if _, ok := h.Typical("a/1", 0); ok {
		t.Fatal("an estimate with no hold observed; want none")
	}
	h.Held("a/1", 0, 100*ms)
	if d, ok := h.Typical("a/1", 0); !ok || d != 100*ms {
		t.Errorf("Typical(a/1) = %v, %v; want 100ms", d, ok)
	}
	if d, ok := h.Typical("a/2", 0); !ok || d != 100*ms { // the template's
		t.Errorf("Typical(a/2) = %v, %v; want the template's 100ms", d, ok)
	}
	if _, ok := h.Typical("b/1", 1); ok {
		t.Error("Typical(b/1) of an unseen template: want none")
	}
	var nilH *Holds
	nilH.Held("a", 0, ms)
	if _, ok := nilH.Typical("a", 0); ok {
		t.Error("a nil Holds estimated")
	}
}

func TestWaits(t *testing.T) {
	for _, tc := range []struct {
		name    string
		typ     time.Duration
		elapsed []time.Duration
		n       uint32
		want    []time.Duration
	}{
		{"plain", 100 * ms, []time.Duration{30 * ms}, 0, []time.Duration{70 * ms, 170 * ms, 270 * ms}},
		{"overdue holder", 100 * ms, []time.Duration{300 * ms}, 1, []time.Duration{0, 100 * ms, 200 * ms}},
		{"semaphore of 2", 100 * ms, []time.Duration{90 * ms, 10 * ms}, 2, []time.Duration{10 * ms, 60 * ms, 110 * ms}},
		{"no holder elapsed known", 100 * ms, nil, 0, []time.Duration{100 * ms, 200 * ms, 300 * ms}},
	} {
		got := Waits(tc.typ, tc.elapsed, tc.n, len(tc.want))
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
