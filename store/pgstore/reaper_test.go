package pgstore

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

func TestReaper(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	s := newStore(t, dsn)
	other := newStore(t, dsn) // a second reaper on the same schema

	dying, living := openSession(t, s), openSession(t, s)
	mustTry(t, s, dying, "a")
	mustTry(t, s, dying, "b")
	mustTry(t, s, living, "c")
	w := make(chan error, 1)
	go func() {
		_, err := other.Acquire(testCtx(t), dying, "c") // queued behind living
		w <- err
	}()
	testkit.Eventually(t, 10*time.Second, "waiter row appears", func() error {
		if n := count(t, s, "waiters"); n != 1 {
			return fmt.Errorf("%d waiter rows", n)
		}
		return nil
	})
	expire(t, s, dying)
	if err := <-w; !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("waiter of the reaped session: %v, want ErrSessionDead", err)
	}
	testkit.Eventually(t, 5*testReaperInterval+time.Second, "reaped", func() error {
		if n := count(t, s, "sessions"); n != 1 {
			return fmt.Errorf("%d session rows", n)
		}
		return nil
	})
	if n := count(t, s, "locks"); n != 1 {
		t.Fatalf("%d lock rows after the reap, want only c", n)
	}
	if n := count(t, s, "waiters"); n != 0 {
		t.Fatalf("%d waiter rows after the reap, want 0", n)
	}
	if l, err := s.Heartbeat(testCtx(t), living); err != nil || !l.Live {
		t.Fatalf("the live session after the reap: %+v, %v", l, err)
	}
}

// TestReaperCountsOnce runs the reaper of a single instance, so the C4
// telemetry of a reap is certain to be its own.
func TestReaperCountsOnce(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	metrics, err := telemetry.NewMetrics(reg, "pg")
	if err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
	var logs testkit.LogBuffer
	s, err := New(testCtx(t), Options{DSN: pgtest.NewDatabase(t), ReaperInterval: testReaperInterval, Metrics: metrics,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer s.Close()
	id := openSession(t, s)
	mustTry(t, s, id, "a")
	expire(t, s, id)
	// The reaper records a reap after its commit (sessionExpired), and
	// lockd_sessions_lost_total last (SessionEnded): wait for that,
	// not for the session row to be gone (clean-clone run r19 read the
	// metrics between the commit and the recording: every count 0).
	testkit.Eventually(t, 5*testReaperInterval+time.Second, "reaped and recorded", func() error {
		if n := count(t, s, "sessions"); n != 0 {
			return fmt.Errorf("%d session rows", n)
		}
		if n := metricValue(t, reg, "lockd_sessions_lost_total", nil); n == 0 {
			return errors.New("lockd_sessions_lost_total still 0")
		}
		return nil
	})
	for name, want := range map[string]float64{
		"lockd_leases_expired_total":    1,
		"lockd_sessions_opened_total":   1,
		"lockd_sessions_active":         0,
		"lockd_locks_held":              0,
		"lockd_lock_release_total":      1,
		"lockd_sessions_lost_total":     1,
		"lockd_lock_acquire_total":      1,
		"lockd_backend_errors_total":    0,
		"lockd_backend_request_seconds": -1, // present
	} {
		got := metricValue(t, reg, name, nil)
		if want >= 0 && got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	evs := logs.Records()
	var msgs []string
	for _, e := range evs {
		msgs = append(msgs, e["msg"].(string))
		if e["backend"] != "pg" {
			t.Errorf("log event without backend=pg: %v", e)
		}
	}
	want := []string{telemetry.EventSessionOpened, telemetry.EventLockAcquired, telemetry.EventLockReleased,
		telemetry.EventLeaseExpired, telemetry.EventSessionLost}
	if !slices.Equal(msgs, want) {
		t.Fatalf("log events %v, want %v", msgs, want)
	}
}
