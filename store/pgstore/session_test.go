package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

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

// TestLocksOfBatched reads the grants of many sessions while the locks
// table is locked against reads: the calls queued meanwhile share one
// SELECT, and each caller gets exactly its own session's grants in key
// order (a session asked for twice gets two equal answers of its own), or
// ErrSessionDead for a session that is gone or expired.
func TestLocksOfBatched(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var batches []int
	s, err := New(testCtx(t), Options{DSN: pgtest.NewDatabase(t), ReaperInterval: time.Hour, // no reaper: expired stays a row
		onLocksOfBatch: func(n int) { mu.Lock(); batches = append(batches, n); mu.Unlock() }})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer s.Close()
	a, b, c, other := openSession(t, s), openSession(t, s), openSession(t, s), openSession(t, s)
	closed, expired := openSession(t, s), openSession(t, s)
	want := map[store.SessionID][]store.Grant{
		a: {mustTry(t, s, a, "lb/a1"), mustTry(t, s, a, "lb/a2"), mustTry(t, s, a, "lb/a3")},
		b: {},
		c: {mustTry(t, s, c, "lb/c1")},
	}
	mustTry(t, s, other, "lb/other")
	mustTry(t, s, expired, "lb/expired")
	expire(t, s, expired)
	if _, err := s.CloseSession(testCtx(t), closed); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	asked := []store.SessionID{c, a, b, closed, expired, a} // a twice in one batch
	const first = 1                                         // the lone request taken at once, then blocked

	tx, err := s.pool.Begin(testCtx(t))
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(testCtx(t), "LOCK TABLE "+s.schemaIdent()+".locks IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatalf("lock table: %v", err)
	}
	type res struct {
		g   []store.Grant
		err error
	}
	results := make([]res, len(asked))
	var wg sync.WaitGroup
	call := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := s.LocksOf(testCtx(t), asked[i])
			results[i] = res{g, err}
		}()
	}
	call(0)
	testkit.Eventually(t, 30*time.Second, "the first LocksOf sent", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(batches) != 1 {
			return fmt.Errorf("%d batches sent", len(batches))
		}
		return nil
	})
	for i := first; i < len(asked); i++ {
		call(i)
	}
	testkit.Eventually(t, 30*time.Second, "the other LocksOf queued", func() error {
		if q := s.locksQ.Queued(); q != len(asked)-first {
			return fmt.Errorf("%d queued", q)
		}
		return nil
	})
	if err := tx.Rollback(testCtx(t)); err != nil {
		t.Fatalf("release table: %v", err)
	}
	wg.Wait()

	mu.Lock()
	if !slices.Equal(batches, []int{first, len(asked) - first}) {
		t.Errorf("LocksOf batches %v, want [%d %d]", batches, first, len(asked)-first)
	}
	mu.Unlock()
	for i, r := range results {
		id := asked[i]
		w, live := want[id]
		if !live {
			if !errors.Is(r.err, store.ErrSessionDead) {
				t.Errorf("LocksOf(%s) #%d = %v, %v; want ErrSessionDead", id, i, r.g, r.err)
			}
			continue
		}
		eq := slices.EqualFunc(r.g, w, func(x, y store.Grant) bool {
			return x.Key == y.Key && x.Session == y.Session && x.Token == y.Token && x.AcquiredAt.Equal(y.AcquiredAt)
		})
		if r.err != nil || r.g == nil || !eq {
			t.Errorf("LocksOf(%s) #%d = %+v, %v; want %+v", id, i, r.g, r.err, w)
		}
	}
	if r1, r5 := results[1].g, results[5].g; len(r1) > 0 && len(r5) > 0 && &r1[0] == &r5[0] {
		t.Error("two LocksOf calls of one session share one slice")
	}
}

// TestCloseSessionSendsEvents closes sessions holding many locks with
// awkward keys (escapes, the longest key of control characters, whose JSON
// is six times its size): the statement that deletes them sends their
// expired events itself, every notification within maxPayload, each lock
// exactly once with its token. With info logging on, every lock is also
// logged as released; without, only counted.
func TestCloseSessionSendsEvents(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	reg := prometheus.NewRegistry()
	metrics, err := telemetry.NewMetrics(reg, "pg")
	if err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
	var logs testkit.LogBuffer
	logged, err := New(testCtx(t), Options{DSN: dsn, ReaperInterval: time.Hour, Metrics: metrics,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer logged.Close()
	quiet := newStore(t, dsn) // logs nothing

	listener, err := pgx.Connect(testCtx(t), dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer listener.Close(context.Background())
	if _, err := listener.Exec(testCtx(t), "LISTEN "+pgx.Identifier{quiet.channel}.Sanitize()); err != nil {
		t.Fatalf("listen: %v", err)
	}

	for _, s := range []*Store{quiet, logged} {
		id := openSession(t, s)
		keys := []string{"cs/\"\\\t\u00e9"}
		for i := range 3 {
			keys = append(keys, fmt.Sprintf("cs/%d/", i)+strings.Repeat("\x01", store.MaxKeyLen-5))
		}
		for i := range 1500 {
			keys = append(keys, fmt.Sprintf("cs/k%04d", i))
		}
		if _, err := s.pool.Exec(testCtx(t), "INSERT INTO "+s.schemaIdent()+".locks (key, session_id, token) SELECT k, $2, nextval('"+s.schema+".fencing_token') FROM unnest($1::text[]) AS k", keys, string(id)); err != nil {
			t.Fatalf("grant: %v", err)
		}
		want := map[grantKey]bool{}
		rows, _ := s.pool.Query(testCtx(t), "SELECT key, token FROM "+s.schemaIdent()+".locks WHERE session_id = $1", string(id))
		var key string
		var tok int64
		if _, err := pgx.ForEachRow(rows, []any{&key, &tok}, func() error { want[grantKey{key, uint64(tok)}] = true; return nil }); err != nil || len(want) != len(keys) {
			t.Fatalf("read grants: %d of %d, %v", len(want), len(keys), err)
		}

		n, err := s.CloseSession(testCtx(t), id)
		if err != nil || n != len(keys) {
			t.Fatalf("CloseSession = %d, %v; want %d, nil", n, err, len(keys))
		}
		got := map[grantKey]bool{}
		notifications := 0
		for len(got) < len(want) {
			ctx, cancel := context.WithTimeout(testCtx(t), 30*time.Second)
			msg, err := listener.WaitForNotification(ctx)
			cancel()
			if err != nil {
				t.Fatalf("after %d of %d events: %v", len(got), len(want), err)
			}
			evs := parseNotices(msg.Payload)
			if len(evs) == 0 || evs[0].Kind == "acquired" {
				continue // the INSERT's, committed before the close
			}
			notifications++
			if len(msg.Payload) > maxPayload {
				t.Errorf("notification of %d bytes, more than %d", len(msg.Payload), maxPayload)
			}
			for _, ev := range evs {
				g := grantKey{ev.Key, ev.Token}
				if ev.Kind != "expired" || ev.Session != string(id) || !want[g] || got[g] {
					t.Fatalf("event %+v: not one of the closed session's grants, or twice", ev)
				}
				got[g] = true
			}
		}
		if notifications < 2 {
			t.Errorf("%d events in %d notification(s), want several", len(got), notifications)
		}
	}
	released := 0
	for _, e := range logs.Records() {
		if e["msg"] == telemetry.EventLockReleased {
			released++
		}
	}
	if wantN := 1504; released != wantN || metricValue(t, reg, "lockd_lock_release_total", nil) != float64(wantN) {
		t.Errorf("%d lock_released events, lockd_lock_release_total %v; want %d of each", released,
			metricValue(t, reg, "lockd_lock_release_total", nil), wantN)
	}
}
