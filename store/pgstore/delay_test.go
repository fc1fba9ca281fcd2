package pgstore

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/store"
)

// delayedGrant grants key to a new session of s with lock-delay d.
func delayedGrant(t *testing.T, s *Store, key string, d time.Duration) {
	t.Helper()
	id := openSession(t, s)
	g := mustTry(t, s, id, key)
	if err := s.SetGrantPolicy(testCtx(t), id, key, g.Token, store.GrantPolicy{LockDelay: d}); err != nil {
		t.Fatalf("SetGrantPolicy: %v", err)
	}
}

// deleteSlowly deletes key's lock row in a transaction that runs
// setBefore (if any) before the delete, clears the voluntary-end settings
// after it and then stays open for hold before it commits — the rest of an expiring or reaping transaction (its other
// statements, NOTIFYs, the WAL flush) under load. It returns the database
// clock read in that transaction just before the COMMIT.
func deleteSlowly(t *testing.T, s *Store, key, setBefore string, hold time.Duration) time.Time {
	t.Helper()
	ctx := testCtx(t)
	var beforeCommit time.Time
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if setBefore != "" {
			if _, err := tx.Exec(ctx, setBefore); err != nil {
				return err
			}
		}
		tag, err := tx.Exec(ctx, "DELETE FROM "+s.schemaIdent()+".locks WHERE key = $1", key)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			t.Errorf("DELETE of %q: %d rows, want 1", key, tag.RowsAffected())
		}
		// Clear the voluntary-end settings: the statement that deleted
		// decides, not what the transaction has set by its commit.
		if _, err := tx.Exec(ctx, "SELECT set_config('lockd.reason', '', true), set_config('lockd.voluntary', '', true)"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT pg_sleep($1)", hold.Seconds()); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&beforeCommit)
	})
	if err != nil {
		t.Fatalf("delete %q: %v", key, err)
	}
	return beforeCommit
}

// delayUntil is the end of key's lock-delay as committed, and whether one
// runs.
func delayUntil(t *testing.T, s *Store, key string) (time.Time, bool) {
	t.Helper()
	var until time.Time
	err := s.pool.QueryRow(testCtx(t), "SELECT until FROM "+s.schemaIdent()+".delays WHERE key = $1", key).Scan(&until)
	if err == pgx.ErrNoRows {
		return time.Time{}, false
	}
	if err != nil {
		t.Fatalf("delay of %q: %v", key, err)
	}
	return until, true
}

// TestLockDelayFromCommit: an involuntary end's lock-delay counts from the
// deleting transaction's commit, when other sessions first see the key
// free, not from its DELETE statement (C2 #ct2-delay "Never shorter than
// d", issue 21). The deleting transaction stays open 500 ms after its
// DELETE; the delay, stamped after the COMMIT as every ending call does,
// must still end no earlier than d after the database clock read just
// before the COMMIT (TestLockDelayAfterCommitTail covers the commit itself).
func TestLockDelayFromCommit(t *testing.T) {
	const (
		d    = 2 * time.Second
		hold = 500 * time.Millisecond
	)
	s := newStore(t, pgtest.NewDatabase(t))

	t.Run("involuntary", func(t *testing.T) {
		delayedGrant(t, s, "k", d)
		beforeCommit := deleteSlowly(t, s, "k", "", hold)
		// What every ending call does after its COMMIT (migration 0013).
		if err := s.stampDelays(testCtx(t)); err != nil {
			t.Fatalf("stampDelays: %v", err)
		}
		var afterCommit time.Time
		if err := s.pool.QueryRow(testCtx(t), "SELECT clock_timestamp()").Scan(&afterCommit); err != nil {
			t.Fatal(err)
		}
		until, ok := delayUntil(t, s, "k")
		if !ok {
			t.Fatal("no lock-delay after an involuntary end")
		}
		// Not asserted (a timing): where the stamp fell between the last
		// read before the COMMIT and the first read after it.
		t.Logf("stamp %v after the last read before the commit, %v before the first read after it",
			until.Add(-d).Sub(beforeCommit), afterCommit.Sub(until.Add(-d)))
		if short := beforeCommit.Add(d).Sub(until); short > 0 {
			t.Fatalf("the lock-delay ends %v after the database clock just before the deleting commit; want no earlier than d = %v (%v short)",
				until.Sub(beforeCommit), d, short)
		}
	})

	// A longer delay already running on the key is kept (greatest).
	t.Run("longer delay kept", func(t *testing.T) {
		delayedGrant(t, s, "g", d)
		var long time.Time
		if err := s.pool.QueryRow(testCtx(t), "INSERT INTO "+s.schemaIdent()+".delays (key, until) VALUES ('g', clock_timestamp() + interval '1 hour') RETURNING until").Scan(&long); err != nil {
			t.Fatal(err)
		}
		deleteSlowly(t, s, "g", "", 0)
		if err := s.stampDelays(testCtx(t)); err != nil {
			t.Fatalf("stampDelays: %v", err)
		}
		if until, _ := delayUntil(t, s, "g"); !until.Equal(long) {
			t.Fatalf("the lock-delay ends at %v; want the longer one already running, %v", until, long)
		}
	})

	// Voluntary ends start none, as decided by the deleting statement.
	for key, set := range map[string]string{
		"released":  "SELECT set_config('lockd.reason', 'released', true)",
		"voluntary": "SELECT set_config('lockd.voluntary', 'on', true)",
	} {
		t.Run(key, func(t *testing.T) {
			delayedGrant(t, s, key, d)
			deleteSlowly(t, s, key, set, 0)
			if until, ok := delayUntil(t, s, key); ok {
				t.Fatalf("a voluntary end started a lock-delay until %v", until)
			}
		})
	}
}
