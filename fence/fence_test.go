package fence_test

import (
	"context"
	"errors"
	"maps"
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockd/fence"
)

// TestMemoryStore: the rule (C2 #ct2-fence-kit) — equal and higher tokens
// are accepted and raise the mark, a lower one is refused with the mark,
// keys are independent, bad input is ErrInvalid.
func TestMemoryStore(t *testing.T) {
	ctx := context.Background()
	m := fence.NewMemoryStore()
	for _, tok := range []uint64{10, 10, 12} {
		if err := m.Advance(ctx, "a", tok); err != nil {
			t.Fatalf("Advance(a, %d): %v", tok, err)
		}
	}
	err := m.Advance(ctx, "a", 11)
	var se *fence.StaleError
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &se) || se.HighWater != 12 || se.Token != 11 || se.Key != "a" {
		t.Fatalf("Advance(a, 11) after 12 = %v; want a StaleError with high water 12", err)
	}
	if m.HighWater("a") != 12 {
		t.Fatalf("HighWater(a) = %d after a refused write; want 12", m.HighWater("a"))
	}
	if err := m.Advance(ctx, "b", 1); err != nil {
		t.Fatalf("Advance(b, 1): %v (keys are independent)", err)
	}
	for _, bad := range []struct {
		key string
		tok uint64
	}{{"", 1}, {"a", 0}, {"a", math.MaxInt64 + 1}} {
		if err := m.Advance(ctx, bad.key, bad.tok); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("Advance(%q, %d) = %v; want ErrInvalid", bad.key, bad.tok, err)
		}
	}
}

// TestMetrics: lockd_fence_stale_refused_total by resource; a nil
// *Metrics is a no-op.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := fence.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Refused(fence.ResourceHTTP)
	m.Refused(fence.ResourceHTTP)
	var nilM *fence.Metrics
	nilM.Refused(fence.ResourceFile)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "lockd_fence_stale_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	if want := map[string]float64{"http": 2, "postgres": 0, "file": 0}; !maps.Equal(got, want) {
		t.Fatalf("lockd_fence_stale_refused_total = %v; want %v", got, want)
	}
}
