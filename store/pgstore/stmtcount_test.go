package pgstore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/store"
)

// stmtCounter is a pgx tracer that counts the round trips (a query, or a
// pipelined batch) and the statements every connection of a pool sends.
type stmtCounter struct {
	mu    sync.Mutex
	trips int
	stmts int
	bySQL map[string]int
}

func (c *stmtCounter) add(trips int, sql string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trips += trips
	if sql != "" {
		c.stmts++
		if c.bySQL == nil {
			c.bySQL = make(map[string]int)
		}
		c.bySQL[strings.Join(strings.Fields(sql), " ")]++
	}
}

// reset zeroes the counts.
func (c *stmtCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trips, c.stmts, c.bySQL = 0, 0, nil
}

// read returns the counts and, for a failure message, each statement's
// count with its first words.
func (c *stmtCounter) read() (trips, stmts int, detail string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, sql := range slices.Sorted(maps.Keys(c.bySQL)) {
		short := sql
		if len(short) > 70 {
			short = short[:70] + "…"
		}
		fmt.Fprintf(&b, "\n\t%3d × %s", c.bySQL[sql], short)
	}
	return c.trips, c.stmts, b.String()
}

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.add(1, d.SQL)
	return ctx
}
func (c *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *stmtCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.add(1, "")
	return ctx
}
func (c *stmtCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.add(0, d.SQL)
}
func (c *stmtCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// countedStore opens a Store on a pool of its own whose statements tr
// counts (the listener's connection too), with no background work of its
// own during a test: no reaper run, no listener probe.
func countedStore(t *testing.T, dsn string, tr *stmtCounter) *Store {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(testCtx(t), cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close) // after the Store's Close (cleanups run last-in first)
	s, err := New(testCtx(t), Options{Pool: pool, ReaperInterval: time.Hour, probeInterval: time.Hour})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// nextEvent returns the next event of ch, failing after 10 s.
func nextEvent(t *testing.T, ch <-chan store.Event, what string) store.Event {
	t.Helper()
	select {
	case ev := <-ch:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s event within 10 s", what)
		return store.Event{}
	}
}

// TestLockPairStatements: what one TryInsert (or Acquire) and one
// DeleteIfOwner of a free key cost the database as every server runs them,
// under a watch of every key (each `lockd serve` keeps one, the lock-loss
// watch), counted by a pgx tracer on every connection of the Store's pool
// and its listener: two round trips, four statements (the grant's batch:
// keyLock, grantBatch; the release's: keyLock, releaseBatch with its
// hand-over), and the release's event delivered to the watch without a
// query. The raw PostgreSQL lock is two round trips and two statements
// (bench_test.go). Before issue 24's statement counts this was three round
// trips and seven statements: the release's batch also sent the hand-over
// and the clearing of lockd.handover as statements of their own, and the
// listener checked the released event against the table (with the
// one-statement release alone: three and five).
func TestLockPairStatements(t *testing.T) {
	t.Parallel()
	tr := &stmtCounter{}
	s := countedStore(t, pgtest.NewDatabase(t), tr)
	ctx := testCtx(t)
	_, ch, err := s.WatchFrom(ctx, "", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	id := openSession(t, s)
	pair := func(i int, key string) {
		var g store.Grant
		if i%2 == 0 {
			g = mustTry(t, s, id, key)
		} else { // the server's Acquire: a waiting acquire's first attempt
			if g, err = s.Acquire(ctx, id, key); err != nil {
				t.Fatalf("Acquire(%s): %v", key, err)
			}
		}
		if err := s.DeleteIfOwner(ctx, id, key, g.Token); err != nil {
			t.Fatalf("DeleteIfOwner(%s): %v", key, err)
		}
		// The listener checks an event before it dispatches it: once both
		// arrived, the pair's work is done.
		for _, want := range []store.EventKind{store.EventAcquired, store.EventReleased} {
			if ev := nextEvent(t, ch, want.String()); ev.Kind != want || ev.Key != key || ev.Token != g.Token {
				t.Fatalf("watch event %+v; want %v of %s (token %d)", ev, want, key, g.Token)
			}
		}
	}
	for i := range 4 { // connections opened, statements prepared
		pair(i, fmt.Sprintf("warm/%d", i))
	}
	tr.reset()
	const pairs = 10
	for i := range pairs {
		pair(i, fmt.Sprintf("k/%d", i))
	}
	trips, stmts, detail := tr.read()
	if trips != 2*pairs || stmts != 4*pairs {
		t.Fatalf("%d pairs on free keys took %d round trips and %d statements; want %d and %d "+
			"(2 and 4 per pair):%s", pairs, trips, stmts, 2*pairs, 4*pairs, detail)
	}
}

// TestReleaseHandOverEvents: the release's one statement that deletes the
// grant and hands the key to the first waiter sends the released event of
// the old grant before the acquired event of the new one (a watch sees
// them in that order), wakes a waiter of another Store by that
// notification alone (its re-check an hour away), and draws the waiter a
// larger token.
func TestReleaseHandOverEvents(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	a, _ := handOverStore(t, dsn, Options{})
	b, _ := handOverStore(t, dsn, Options{})
	ctx := testCtx(t)
	_, ch, err := a.WatchFrom(ctx, "", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	holder, waiter := openSession(t, a), openSession(t, b)
	g0 := mustTry(t, a, holder, "k")
	if ev := nextEvent(t, ch, "acquired"); ev.Kind != store.EventAcquired || ev.Token != g0.Token {
		t.Fatalf("first event %+v; want the holder's acquired (token %d)", ev, g0.Token)
	}
	res := queuedAcquire(t, ctx, b, a, waiter, "k")
	if err := a.DeleteIfOwner(ctx, holder, "k", g0.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	if ev := nextEvent(t, ch, "released"); ev.Kind != store.EventReleased || ev.Key != "k" || ev.Session != holder || ev.Token != g0.Token {
		t.Fatalf("event after the release %+v; want released k by the holder (token %d)", ev, g0.Token)
	}
	ev := nextEvent(t, ch, "acquired")
	if ev.Kind != store.EventAcquired || ev.Key != "k" || ev.Session != waiter || ev.Token <= g0.Token {
		t.Fatalf("event after the released one %+v; want acquired k by the waiter, token above %d", ev, g0.Token)
	}
	select {
	case ans := <-res:
		if ans.err != nil || ans.g.Token != ev.Token || ans.g.Session != waiter {
			t.Fatalf("the waiter's Acquire = %+v, %v; want the handed grant, token %d", ans.g, ans.err, ev.Token)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter on the other Store was not answered within 20 s: the release's notification did not wake it")
	}
}
