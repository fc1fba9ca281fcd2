package etcdstore

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// TestLocksOfKeepsGrantMadeDuringRead: a grant made through this Store
// while a LocksOf of the same session is between its read and its
// reconciling of the cache stays in the cache, so its release is counted
// (lockd_lock_release_total{reason="release"}). Before heldGen the
// reconcile dropped it and the release went uncounted (TestServeEmbedded
// saw 2 releases of 3 under load).
func TestLocksOfKeepsGrantMadeDuringRead(t *testing.T) {
	st, reg := metricStore(t)
	id := openSession(t, st, 10*time.Second)
	var g store.Grant
	afterLocksOfRead = func() {
		if g.Key == "" {
			g = mustTry(t, st, id, "during")
		}
	}
	t.Cleanup(func() { afterLocksOfRead = nil })
	if _, err := st.LocksOf(ctxT(t), id); err != nil {
		t.Fatalf("LocksOf: %v", err)
	}
	afterLocksOfRead = nil
	if g.Key == "" {
		t.Fatal("the hook never ran")
	}
	st.mu.Lock()
	_, cached := st.sessions[id].held["during"]
	st.mu.Unlock()
	if !cached {
		t.Error("the grant made during LocksOf dropped out of the session's cache")
	}
	if err := st.DeleteIfOwner(ctxT(t), id, "during", g.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	if n := releases(t, reg, telemetry.ReleaseRelease); n != 1 {
		t.Errorf("lockd_lock_release_total{reason=release} = %v after one release, want 1", n)
	}
}

// releases reads lockd_lock_release_total{reason}.
func releases(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lockd_lock_release_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
