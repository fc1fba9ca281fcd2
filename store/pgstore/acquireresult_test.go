package pgstore

import (
	"testing"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// TestAcquireCountsEveryCall (C4 #ct4-acquire-result): every Acquire and
// TryInsert call counts once in lockd_lock_acquire_total — a grant the
// session already held as granted, invalid input as error — as on etcd.
// Before issue 22 PostgreSQL counted neither.
func TestAcquireCountsEveryCall(t *testing.T) {
	t.Parallel()
	s, _, reg := gcStore(t)
	id := openSession(t, s)
	count := func(result string) float64 {
		return metricValue(t, reg, "lockd_lock_acquire_total", map[string]string{"result": result})
	}
	mustTry(t, s, id, "a") // granted
	if _, ok, err := s.TryInsert(testCtx(t), id, "a"); err != nil || !ok {
		t.Fatalf("TryInsert of a held key = %v, %v; want its grant", ok, err)
	}
	if _, err := s.Acquire(testCtx(t), id, "a"); err != nil {
		t.Fatalf("Acquire of a held key: %v", err)
	}
	if _, _, err := s.TryInsert(testCtx(t), id, ""); err == nil {
		t.Fatal("TryInsert of an empty key succeeded")
	}
	if _, err := s.Acquire(testCtx(t), id, "", store.WithLimit(2)); err == nil {
		t.Fatal("Acquire of an empty key succeeded")
	}
	if g, e := count(telemetry.AcquireGranted), count(telemetry.AcquireError); g != 3 || e != 2 {
		t.Fatalf("lockd_lock_acquire_total: granted %v, error %v; want 3 (one grant, then it again twice) and 2 (invalid input)", g, e)
	}
}
