package pgstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"lock.dev/lockd/internal/pgtest"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testkit"
	"lock.dev/lockd/store"
)

const (
	// ttl is the TTL of sessions meant to expire.
	ttl = store.MinTTL
	// longTTL is the TTL of sessions that must outlive their test, which
	// does not heartbeat them, however slowly a loaded machine runs it.
	longTTL = 10 * time.Minute
)

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func openSession(t testing.TB, s *Store) store.SessionID {
	t.Helper()
	sess, err := s.OpenSession(testCtx(t), longTTL)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	return sess.ID
}

func mustTry(t testing.TB, s *Store, id store.SessionID, key string) store.Grant {
	t.Helper()
	g, ok, err := s.TryInsert(testCtx(t), id, key)
	if err != nil || !ok {
		t.Fatalf("TryInsert(%q) = %v, %v; want a grant", key, ok, err)
	}
	return g
}

// count returns the number of rows of a table of s's schema.
func count(t testing.TB, s *Store, table string) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(testCtx(t), "SELECT count(*) FROM "+s.schemaIdent()+"."+table).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

func TestExpiredSessionIsDeadBeforeReap(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	s, err := New(testCtx(t), Options{DSN: dsn, ReaperInterval: time.Hour}) // the reaper never runs here
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer s.Close()
	id := openSession(t, s)
	g := mustTry(t, s, id, "k/held")
	expire(t, s, id)

	if l, err := s.Heartbeat(testCtx(t), id); err != nil || l.Live || l.Remaining != 0 {
		t.Fatalf("Heartbeat of an expired, unreaped session = %+v, %v; want not live", l, err)
	}
	var alive bool
	if err := s.pool.QueryRow(testCtx(t), "SELECT expires_at > now() FROM "+s.schemaIdent()+".sessions WHERE id = $1", string(id)).Scan(&alive); err != nil {
		t.Fatalf("read session row: %v", err)
	}
	if alive {
		t.Fatal("Heartbeat resurrected an expired session")
	}
	if _, _, err := s.TryInsert(testCtx(t), id, "k/new"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("TryInsert = %v, want ErrSessionDead", err)
	}
	if _, err := s.Acquire(testCtx(t), id, "k/new"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("Acquire = %v, want ErrSessionDead", err)
	}
	if _, err := s.LocksOf(testCtx(t), id); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("LocksOf = %v, want ErrSessionDead", err)
	}
	if err := s.DeleteIfOwner(testCtx(t), id, "k/held", g.Token); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("DeleteIfOwner = %v, want ErrNotOwner", err)
	}
	if n := count(t, s, "locks"); n != 1 {
		t.Fatalf("%d lock rows, want only k/held (nothing written for the dead session)", n)
	}
	if n := count(t, s, "waiters"); n != 0 {
		t.Fatalf("%d waiter rows, want 0", n)
	}
	// Closing it deletes it, as the reaper would, and reports nothing
	// released: the lock was already forfeit.
	if n, err := s.CloseSession(testCtx(t), id); err != nil || n != 0 {
		t.Fatalf("CloseSession = %d, %v; want 0, nil", n, err)
	}
	if n := count(t, s, "locks"); n != 0 {
		t.Fatalf("%d lock rows after close, want 0", n)
	}
}

func TestGrantsDoNotExtendSession(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgtest.NewDatabase(t))
	id := openSession(t, s)
	read := func() time.Time {
		var at time.Time
		if err := s.pool.QueryRow(testCtx(t), "SELECT expires_at FROM "+s.schemaIdent()+".sessions WHERE id = $1", string(id)).Scan(&at); err != nil {
			t.Fatalf("read expires_at: %v", err)
		}
		return at
	}
	before := read()
	g := mustTry(t, s, id, "k")
	if _, err := s.Acquire(testCtx(t), id, "k2"); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if after := read(); !after.Equal(before) {
		t.Fatalf("expires_at moved from %v to %v on a grant", before, after)
	}
	if g.Remaining <= 0 || g.Remaining > longTTL {
		t.Fatalf("grant Remaining = %v, want in (0, %v]", g.Remaining, longTTL)
	}
	l, err := s.Heartbeat(testCtx(t), id)
	if err != nil || !l.Live || l.Remaining != longTTL {
		t.Fatalf("Heartbeat = %+v, %v; want live with Remaining = TTL", l, err)
	}
	if after := read(); !after.After(before) {
		t.Fatalf("Heartbeat did not move expires_at (%v -> %v)", before, after)
	}
}

// TestTokensIncreaseUnderContention has many sessions on two instances take
// one key in turns; each holder records its token while it holds the key,
// so the record is in grant order and must be strictly increasing.
func TestTokensIncreaseUnderContention(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	insts := []*Store{newStore(t, dsn), newStore(t, dsn)}
	const workers, rounds = 8, 10
	var (
		mu     sync.Mutex
		tokens []uint64
		wg     sync.WaitGroup
		errs   = make(chan error, workers)
	)
	for i := range workers {
		st := insts[i%2]
		id := openSession(t, st)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				g, err := st.Acquire(testCtx(t), id, "contended")
				if err != nil {
					errs <- fmt.Errorf("Acquire: %w", err)
					return
				}
				mu.Lock()
				tokens = append(tokens, g.Token)
				mu.Unlock()
				if err := st.DeleteIfOwner(testCtx(t), id, "contended", g.Token); err != nil {
					errs <- fmt.Errorf("DeleteIfOwner: %w", err)
					return
				}
				if _, err := st.Heartbeat(testCtx(t), id); err != nil {
					errs <- fmt.Errorf("Heartbeat: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(tokens) != workers*rounds {
		t.Fatalf("%d grants, want %d", len(tokens), workers*rounds)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("grant %d has token %d after %d: not strictly increasing (%v)", i, tokens[i], tokens[i-1], tokens)
		}
	}
}

func TestCancelledAcquireLeavesNoWaiterRow(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	a, b := newStore(t, dsn), newStore(t, dsn)
	holder := openSession(t, a)
	g := mustTry(t, a, holder, "k")
	w := openSession(t, b)
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, w, "k")
		done <- err
	}()
	testkit.Eventually(t, 10*time.Second, "waiter row appears", func() error {
		if n := count(t, a, "waiters"); n != 1 {
			return fmt.Errorf("%d waiter rows", n)
		}
		return nil
	})
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return after cancel")
	}
	// The row is deleted before Acquire returns.
	if n := count(t, a, "waiters"); n != 0 {
		t.Fatalf("%d waiter rows after the cancelled Acquire returned, want 0", n)
	}
	// The key is still the holder's and free for the next after release.
	if err := a.DeleteIfOwner(testCtx(t), holder, "k", g.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	mustTry(t, a, openSession(t, a), "k")
}

func TestCloseEndsWaitersAndWatches(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	a, b := newStore(t, dsn), newStore(t, dsn)
	holder := openSession(t, a)
	mustTry(t, a, holder, "k")
	w := openSession(t, b)
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(testCtx(t), w, "k")
		done <- err
	}()
	testkit.Eventually(t, 10*time.Second, "waiter row appears", func() error {
		if n := count(t, a, "waiters"); n != 1 {
			return fmt.Errorf("%d waiter rows", n)
		}
		return nil
	})
	ch, err := b.Watch(testCtx(t), "")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := <-done; !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("waiting Acquire after Close: %v, want ErrUnavailable", err)
	}
	if n := count(t, a, "waiters"); n != 0 {
		t.Fatalf("%d waiter rows after Close, want 0", n)
	}
	ev, ok := <-ch
	if !ok || !errors.Is(ev.Err, store.ErrUnavailable) {
		t.Fatalf("watch after Close: %+v, %v; want a final event with ErrUnavailable", ev, ok)
	}
	if _, ok := <-ch; ok {
		t.Fatal("watch channel not closed after its final event")
	}
	if _, err := b.Heartbeat(testCtx(t), w); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Heartbeat after Close: %v, want ErrUnavailable", err)
	}
	// Close does not close sessions: the session rows are shared, and a is
	// still there to keep w alive.
	if l, err := a.Heartbeat(testCtx(t), w); err != nil || !l.Live {
		t.Fatalf("Heartbeat through the other instance = %+v, %v; want live", l, err)
	}
}

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
	testkit.Eventually(t, 5*testReaperInterval+time.Second, "reaped", func() error {
		if n := count(t, s, "sessions"); n != 0 {
			return fmt.Errorf("%d session rows", n)
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

func TestWatchSlowConsumerBreaks(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgtest.NewDatabase(t))
	ch, err := s.Watch(testCtx(t), "slow/")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	id := openSession(t, s)
	// Each grant and release is two events; nobody reads the channel.
	for i := 0; i < watchBuffer/2+2; i++ {
		g := mustTry(t, s, id, "slow/k")
		if err := s.DeleteIfOwner(testCtx(t), id, "slow/k", g.Token); err != nil {
			t.Fatalf("DeleteIfOwner: %v", err)
		}
	}
	n := 0
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("channel closed after %d events without a final error", n)
			}
			if ev.Err != nil {
				if !errors.Is(ev.Err, store.ErrContention) {
					t.Fatalf("final event error %v, want ErrContention", ev.Err)
				}
				if n != watchBuffer {
					t.Fatalf("watch broke after %d buffered events, want %d", n, watchBuffer)
				}
				if _, ok := <-ch; ok {
					t.Fatal("channel not closed after the final event")
				}
				return
			}
			n++
		case <-timeout:
			t.Fatalf("no final error event after %d events", n)
		}
	}
}

// listenerPIDs are the backends of the database running LISTEN connections.
func terminateListeners(t testing.TB, s *Store) int {
	t.Helper()
	var n int
	err := s.pool.QueryRow(testCtx(t), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN %'`).Scan(&n)
	if err != nil {
		t.Fatalf("terminate listeners: %v", err)
	}
	return n
}

func TestListenerLossBreaksWatchAndRecovers(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	s := newStore(t, dsn)
	ch, err := s.Watch(testCtx(t), "")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	holder := openSession(t, s)
	g := mustTry(t, s, holder, "k")
	if ev := <-ch; ev.Kind != store.EventAcquired || ev.Token != g.Token {
		t.Fatalf("first event %+v, want acquired with token %d", ev, g.Token)
	}
	waiter := openSession(t, s)
	res := make(chan error, 1)
	go func() {
		_, err := s.Acquire(testCtx(t), waiter, "k")
		res <- err
	}()
	testkit.Eventually(t, 10*time.Second, "waiter row appears", func() error {
		if n := count(t, s, "waiters"); n != 1 {
			return fmt.Errorf("%d waiter rows", n)
		}
		return nil
	})
	if n := terminateListeners(t, s); n != 1 {
		t.Fatalf("terminated %d listening backends, want 1", n)
	}
	select {
	case ev, ok := <-ch:
		if !ok || !errors.Is(ev.Err, store.ErrUnavailable) {
			t.Fatalf("watch after the listener's connection died: %+v, %v; want final ErrUnavailable", ev, ok)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch not broken after the listener's connection died")
	}
	// The listener reconnects: a new watch works and sees the release, and
	// the waiter is woken by it (not by the periodic re-check, which would
	// take recheckInterval).
	var ch2 <-chan store.Event
	testkit.Eventually(t, 10*time.Second, "Watch works again", func() error {
		ch2, err = s.Watch(testCtx(t), "")
		return err
	})
	released := time.Now()
	if err := s.DeleteIfOwner(testCtx(t), holder, "k", g.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	if err := <-res; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if took := time.Since(released); took >= recheckInterval {
		t.Errorf("waiter granted %v after the release; the NOTIFY wake-up should take far less than %v", took, recheckInterval)
	}
	for _, want := range []store.EventKind{store.EventReleased, store.EventAcquired} {
		select {
		case ev := <-ch2:
			if ev.Kind != want || ev.Key != "k" {
				t.Fatalf("event %+v, want %v of k", ev, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %v event on the new watch", want)
		}
	}
}

// TestListenerProbeKeepsHealthyWatch makes the listener probe its quiet
// connection every few milliseconds: a healthy connection must pass every
// probe, with no event lost and the watch intact.
func TestListenerProbeKeepsHealthyWatch(t *testing.T) {
	t.Parallel()
	s, err := New(testCtx(t), Options{DSN: pgtest.NewDatabase(t), probeInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer s.Close()
	ch, err := s.Watch(testCtx(t), "")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	id := openSession(t, s)
	for i := range 10 {
		g := mustTry(t, s, id, "k")
		if err := s.DeleteIfOwner(testCtx(t), id, "k", g.Token); err != nil {
			t.Fatalf("DeleteIfOwner: %v", err)
		}
		for _, want := range []store.EventKind{store.EventAcquired, store.EventReleased} {
			select {
			case ev := <-ch:
				if ev.Err != nil || ev.Kind != want || ev.Token != g.Token {
					t.Fatalf("round %d: event %+v, want %v with token %d", i, ev, want, g.Token)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: no %v event", i, want)
			}
		}
		time.Sleep(20 * time.Millisecond) // let several probes run while quiet; not synchronisation
	}
	// The probes did run: the listening backend's last statement is one.
	testkit.Eventually(t, 10*time.Second, "listener probed", func() error {
		var n int
		err := s.pool.QueryRow(testCtx(t), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND query = 'SELECT 1'`).Scan(&n)
		if err == nil && n != 1 {
			err = fmt.Errorf("%d backends last ran the probe", n)
		}
		return err
	})
}

func TestWatchSeesNothingBeforeIt(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgtest.NewDatabase(t))
	id := openSession(t, s)
	for i := range 20 {
		mustTry(t, s, id, fmt.Sprintf("before/%d", i))
	}
	ch, err := s.Watch(testCtx(t), "")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	g := mustTry(t, s, id, "after")
	select {
	case ev := <-ch:
		if ev.Key != "after" || ev.Kind != store.EventAcquired || ev.Token != g.Token {
			t.Fatalf("first event %+v, want the grant of after (nothing committed before Watch)", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
	}
}

func TestSchemasAreIsolated(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	open := func(schema string) *Store {
		s, err := New(testCtx(t), Options{DSN: dsn, Schema: schema, ReaperInterval: testReaperInterval})
		if err != nil {
			t.Fatalf("New(schema %s): %v", schema, err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := open("lockd_a"), open("lockd_b")
	ch, err := b.Watch(testCtx(t), "")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	ida := openSession(t, a)
	mustTry(t, a, ida, "k")
	if _, found, err := b.Inspect(testCtx(t), "k"); err != nil || found {
		t.Fatalf("Inspect in the other schema = %v, %v; want not found", found, err)
	}
	if _, _, err := b.TryInsert(testCtx(t), ida, "k"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("TryInsert with the other schema's session = %v, want ErrSessionDead", err)
	}
	idb := openSession(t, b)
	g := mustTry(t, b, idb, "k")
	select {
	case ev := <-ch:
		if ev.Session != idb || ev.Token != g.Token {
			t.Fatalf("watch on schema b saw %+v, want only b's grant %+v", ev, g)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
	}
	if _, err := New(testCtx(t), Options{DSN: dsn, Schema: "Bad-Name"}); !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("New(bad schema) = %v, want ErrInvalidArgument", err)
	}
}

// TestMigrationRace starts several instances on an empty database at once:
// the advisory lock makes exactly one apply the migrations.
func TestMigrationRace(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	const n = 4
	stores := make([]*Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			stores[i], errs[i] = New(testCtx(t), Options{DSN: dsn})
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("New #%d: %v", i, err)
		}
		defer stores[i].Close()
	}
	ms, err := loadMigrations()
	if err != nil {
		t.Fatalf("loadMigrations: %v", err)
	}
	var versions []int
	rows, err := stores[0].pool.Query(testCtx(t), "SELECT version FROM lockd.schema_migrations ORDER BY version")
	if err == nil {
		versions, err = pgx.CollectRows(rows, pgx.RowTo[int])
	}
	if err != nil {
		t.Fatalf("read schema_migrations: %v", err)
	}
	if len(versions) != len(ms) {
		t.Fatalf("schema_migrations %v, want versions 1..%d once each", versions, len(ms))
	}
	// All instances work on the one schema.
	id := openSession(t, stores[1])
	g := mustTry(t, stores[2], id, "k")
	if info, found, err := stores[3].Inspect(testCtx(t), "k"); err != nil || !found || info.Token != g.Token {
		t.Fatalf("Inspect = %+v, %v, %v", info, found, err)
	}
	// A schema newer than this code is refused.
	if _, err := stores[0].pool.Exec(testCtx(t), "INSERT INTO lockd.schema_migrations (version, name) VALUES ($1, 'future')", len(ms)+1); err != nil {
		t.Fatalf("insert future version: %v", err)
	}
	if s, err := New(testCtx(t), Options{DSN: dsn}); err == nil {
		s.Close()
		t.Fatal("New on a schema newer than the code succeeded")
	}
}

func TestErrorClassification(t *testing.T) {
	t.Parallel()
	live := context.Background()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	pgErr := func(code string) error { return fmt.Errorf("query: %w", &pgconn.PgError{Code: code}) }
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want error // nil: unclassified
	}{
		{"serialization", live, pgErr("40001"), store.ErrContention},
		{"deadlock", live, pgErr("40P01"), store.ErrContention},
		{"lock not available", live, pgErr("55P03"), store.ErrContention},
		{"read only", live, pgErr("25006"), store.ErrNotLeader},
		{"admin shutdown", live, pgErr("57P01"), store.ErrUnavailable},
		{"cannot connect now", live, pgErr("57P03"), store.ErrUnavailable},
		{"connection failure", live, pgErr("08006"), store.ErrUnavailable},
		{"too many connections", live, pgErr("53300"), store.ErrUnavailable},
		{"statement timeout", live, pgErr("57014"), store.ErrUnavailable},
		{"foreign key", live, pgErr("23503"), store.ErrSessionDead},
		{"eof", live, fmt.Errorf("read: %w", io.ErrUnexpectedEOF), store.ErrUnavailable},
		{"refused", live, &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, store.ErrUnavailable},
		{"internal timeout", live, fmt.Errorf("commit: %w", context.DeadlineExceeded), store.ErrUnavailable},
		{"caller cancelled", cancelled, pgErr("57P01"), context.Canceled},
		{"caller cancelled, driver says so", cancelled, context.Canceled, context.Canceled},
		{"syntax", live, pgErr("42601"), nil},
	} {
		got := classify(tc.ctx, "op", tc.err)
		if tc.want == nil {
			if store.IsRetryable(got) || errors.Is(got, store.ErrSessionDead) {
				t.Errorf("%s: classify = %v, want unclassified", tc.name, got)
			}
			continue
		}
		if !errors.Is(got, tc.want) {
			t.Errorf("%s: classify = %v, want errors.Is(err, %v)", tc.name, got, tc.want)
		}
		if tc.ctx.Err() != nil && store.IsRetryable(got) {
			t.Errorf("%s: classify = %v is retryable, but the caller's context is done", tc.name, got)
		}
		if tc.ctx.Err() == nil && errors.Is(got, context.DeadlineExceeded) {
			t.Errorf("%s: classify = %v matches context.DeadlineExceeded while the caller's context is live", tc.name, got)
		}
	}
	if got := classify(live, "op", nil); got != nil {
		t.Errorf("classify(nil) = %v", got)
	}
}

func TestUnavailableServer(t *testing.T) {
	t.Parallel()
	// Nothing listens: New fails as unavailable.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ctx, cancel := context.WithTimeout(testCtx(t), 10*time.Second)
	defer cancel()
	_, err = New(ctx, Options{DSN: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", port)})
	if !errors.Is(err, store.ErrUnavailable) || !store.IsRetryable(err) {
		t.Fatalf("New against a closed port: %v, want ErrUnavailable", err)
	}

	// A server that stops under a running store.
	srv := pgtest.NewServer(t)
	s := newStore(t, srv.DSN("postgres"))
	id := openSession(t, s)
	g := mustTry(t, s, id, "k")
	ch, err := s.Watch(testCtx(t), "")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatalf("stop server: %v", err)
	}
	select {
	case ev, ok := <-ch:
		if !ok || !errors.Is(ev.Err, store.ErrUnavailable) {
			t.Fatalf("watch after server stop: %+v, %v; want a final ErrUnavailable", ev, ok)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch not broken by the server stop")
	}
	ctx, cancel = context.WithTimeout(testCtx(t), 20*time.Second)
	defer cancel()
	checks := map[string]error{}
	_, checks["Heartbeat"] = s.Heartbeat(ctx, id)
	_, _, checks["TryInsert"] = s.TryInsert(ctx, id, "k2")
	_, checks["Acquire"] = s.Acquire(ctx, id, "k2")
	checks["DeleteIfOwner"] = s.DeleteIfOwner(ctx, id, "k", g.Token)
	_, _, checks["Inspect"] = s.Inspect(ctx, "k")
	_, checks["OpenSession"] = s.OpenSession(ctx, ttl)
	_, checks["Watch"] = s.Watch(ctx, "")
	for op, err := range checks {
		if !errors.Is(err, store.ErrUnavailable) || !store.IsRetryable(err) || errors.Is(err, store.ErrSessionDead) {
			t.Errorf("%s with the server down: %v, want ErrUnavailable (retryable, not session dead)", op, err)
		}
	}
}

func TestReadOnlyIsNotLeader(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	s := newStore(t, dsn)
	id := openSession(t, s)
	// New connections to the database start read-only, as on a standby.
	var db string
	if err := s.pool.QueryRow(testCtx(t), "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(testCtx(t), "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET default_transaction_read_only = on"); err != nil {
		t.Fatalf("alter database: %v", err)
	}
	ro := newStoreNoMigrate(t, dsn)
	if _, err := ro.OpenSession(testCtx(t), ttl); !errors.Is(err, store.ErrNotLeader) || !store.IsRetryable(err) {
		t.Fatalf("OpenSession on a read-only database: %v, want ErrNotLeader", err)
	}
	if _, err := ro.Heartbeat(testCtx(t), id); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("Heartbeat on a read-only database: %v, want ErrNotLeader (not 'not live')", err)
	}
	if _, _, err := ro.TryInsert(testCtx(t), id, "k"); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("TryInsert on a read-only database: %v, want ErrNotLeader", err)
	}
}

// newStoreNoMigrate opens a Store whose pool starts after the schema exists
// (migrations are a no-op then) on a database that may be read-only: the
// migration transaction only reads when there is nothing to do.
func newStoreNoMigrate(t testing.TB, dsn string) *Store {
	t.Helper()
	s, err := New(testCtx(t), Options{DSN: dsn, ReaperInterval: testReaperInterval})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestExternalPool(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(testCtx(t), dsn)
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	defer pool.Close()
	s, err := New(testCtx(t), Options{Pool: pool})
	if err != nil {
		t.Fatalf("New(Pool): %v", err)
	}
	id := openSession(t, s)
	mustTry(t, s, id, "k")
	s.Close()
	// The pool is the caller's: still usable after Close.
	if err := pool.Ping(testCtx(t)); err != nil {
		t.Fatalf("pool after Store.Close: %v", err)
	}
}

func TestPrefixEnd(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"", "", false},
		{"a", "b", true},
		{"ls/", "ls0", true},
		{"a\U0010FFFF", "b", true},
		{"\U0010FFFF", "", false},
		{"x\uD7FF", "x\uE000", true},
		{"é", "ê", true},
	} {
		got, ok := prefixEnd(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("prefixEnd(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestListOrderIsBytewise(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgtest.NewDatabase(t))
	id := openSession(t, s)
	keys := []string{"p/B", "p/a", "p/é", "p/Z", "p/\U0010FFFF", "p/_", "q", "p"}
	for _, k := range keys {
		mustTry(t, s, id, k)
	}
	l, err := s.List(testCtx(t), "p/", "", 0)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var got []string
	for _, i := range l {
		got = append(got, i.Key)
	}
	want := []string{"p/B", "p/Z", "p/_", "p/a", "p/é", "p/\U0010FFFF"}
	if !slices.Equal(got, want) {
		t.Fatalf("List(p/) = %q, want %q (Go string order)", got, want)
	}
	locks, err := s.LocksOf(testCtx(t), id)
	if err != nil || len(locks) != len(keys) || !slices.IsSortedFunc(locks, func(a, b store.Grant) int {
		return bytesCompare(a.Key, b.Key)
	}) {
		t.Fatalf("LocksOf = %+v, %v; want all %d keys in Go string order", locks, err, len(keys))
	}
}

func bytesCompare(a, b string) int { return bytes.Compare([]byte(a), []byte(b)) }

// metricValue sums the samples of a metric family whose labels include
// labels.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
					continue metrics
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}
