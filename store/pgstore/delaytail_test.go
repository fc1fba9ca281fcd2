package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// quietStore opens a Store on dsn whose reaper does not run during the
// test (its interval is an hour), closed when the test ends.
func quietStore(t *testing.T, dsn string) *Store {
	t.Helper()
	s, err := New(testCtx(t), Options{DSN: dsn, ReaperInterval: time.Hour})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// holdCommits installs, in s's schema, a deferred constraint trigger on
// delays that makes every transaction starting a lock-delay wait at its
// COMMIT — after every other deferred trigger of that row ("zz" sorts
// last) and before the commit is visible — for the advisory lock (21, 21),
// and returns a function that takes that lock in a transaction of its own
// and one that lets the commits go (rolls that transaction back).
func holdCommits(t *testing.T, s *Store) (hold func(t *testing.T), release func()) {
	t.Helper()
	ctx := testCtx(t)
	sch := s.schemaIdent()
	for _, q := range []string{
		`CREATE FUNCTION ` + sch + `.test_hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock(21, 21); RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER zz_test_hold_commit AFTER INSERT OR UPDATE ON ` + sch + `.delays
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.pending_ms IS NOT NULL)
		EXECUTE FUNCTION ` + sch + `.test_hold_commit()`,
	} {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			t.Fatalf("install the commit hook: %v", err)
		}
	}
	var cancel func()
	hold = func(t *testing.T) {
		t.Helper()
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(21, 21)"); err != nil {
			t.Fatal(err)
		}
		cancel = func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }
		t.Cleanup(cancel)
	}
	return hold, func() { cancel() }
}

// TestLockDelayAfterCommitTail: no grant comes less than d after any
// session last saw the holder, however long the deleting transaction's
// commit takes after its last statement (C2 #ct2-delay, issue 21). The
// commit's tail (NOTIFY queueing, the commit record's flush, a synchronous
// standby) is held open by a deferred trigger that waits for a lock of the
// test; while it waits, a reader still sees the holder, 300 ms after the
// deleting transaction began its COMMIT. The waiter's grant (acquired_at,
// the granting transaction's database clock) must come at least d after
// that reading, for each kind of involuntary end: Revoke, the reaper's
// expiry and ExpireSession (the server's close of a silent client).
func TestLockDelayAfterCommitTail(t *testing.T) {
	const (
		d    = 2 * time.Second
		tail = 300 * time.Millisecond
	)
	dsn := pgtest.NewDatabase(t)
	// Two instances whose reapers do not run by themselves: the expiry
	// subtest runs one, and ExpireSession must find its session.
	s, b := quietStore(t, dsn), quietStore(t, dsn) // b: the waiter's
	hold, release := holdCommits(t, s)

	for _, c := range []struct {
		name string
		end  func(t *testing.T, g store.Grant) error
	}{
		{"revoke", func(t *testing.T, g store.Grant) error {
			_, found, err := s.Revoke(testCtx(t), g.Key)
			if err == nil && !found {
				err = fmt.Errorf("Revoke(%q): not found", g.Key)
			}
			return err
		}},
		{"expiry", func(t *testing.T, g store.Grant) error {
			expire(t, s, g.Session)
			s.reap(testCtx(t))
			return nil
		}},
		{"ExpireSession", func(t *testing.T, g store.Grant) error {
			expire(t, s, g.Session)
			e, err := s.ExpireSession(testCtx(t), g.Session)
			if err == nil && (!e.Ended || e.Released != 1) {
				err = fmt.Errorf("ExpireSession = %+v; want ended with 1 lock released", e)
			}
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			key := "tail/" + c.name
			h := openSession(t, s)
			g := mustTry(t, s, h, key)
			if err := s.SetGrantPolicy(ctx, h, key, g.Token, store.GrantPolicy{LockDelay: d}); err != nil {
				t.Fatalf("SetGrantPolicy: %v", err)
			}
			w := openSession(t, b)
			type result struct {
				g   store.Grant
				err error
			}
			granted := make(chan result, 1)
			go func() {
				wg, err := b.Acquire(ctx, w, key)
				granted <- result{wg, err}
			}()
			testkit.Eventually(t, 10*time.Second, "the waiter queued", func() bool { return count(t, s, "waiters") == 1 })

			hold(t)
			ended := make(chan error, 1)
			go func() { ended <- c.end(t, g) }()
			// The ending transaction is in its COMMIT, waiting for our lock.
			testkit.Eventually(t, 30*time.Second, "the ending commit waits in the hook", func() error {
				select {
				case err := <-ended:
					t.Fatalf("the end (%s) committed without waiting in the hook, which holds every commit that starts a lock-delay: it started none (err %v)", c.name, err)
				default:
				}
				var n int
				err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
					WHERE locktype = 'advisory' AND classid = 21 AND objid = 21 AND objsubid = 2 AND NOT granted`).Scan(&n)
				if err == nil && n != 1 {
					err = fmt.Errorf("%d waiting", n)
				}
				return err
			})
			// The tail's length: a gap the reading below comes after.
			if _, err := s.pool.Exec(ctx, "SELECT pg_sleep($1)", tail.Seconds()); err != nil {
				t.Fatal(err)
			}
			var seen time.Time
			var held bool
			if err := s.pool.QueryRow(ctx, `SELECT clock_timestamp(), EXISTS (SELECT 1 FROM `+s.schemaIdent()+`.locks
				WHERE key = $1 AND token = $2)`, key, int64(g.Token)).Scan(&seen, &held); err != nil {
				t.Fatal(err)
			}
			if !held {
				t.Fatalf("the holder of %q is not visible while its end's commit waits", key)
			}
			release()
			if err := <-ended; err != nil {
				t.Fatalf("the end: %v", err)
			}
			var r result
			select {
			case r = <-granted:
			case <-time.After(d + 30*time.Second):
				t.Fatalf("the waiter was not granted %q within %v", key, d+30*time.Second)
			}
			if r.err != nil {
				t.Fatalf("the waiter's Acquire: %v", r.err)
			}
			if el := r.g.AcquiredAt.Sub(seen); el < d {
				t.Fatalf("the waiter was granted %q %v after a reader last saw the holder (database clock); want no earlier than its lock-delay %v (%v short)",
					key, el, d, d-el)
			}
		})
	}
}

// TestLockDelayPendingUntilStamped: a lock-delay whose ending call never
// stamped it (lockd died after the commit) keeps the key however old its
// until, reports d to Inspect, and is stamped by the reaper with an end at
// least d after the deleting commit (C2 #ct2-delay).
func TestLockDelayPendingUntilStamped(t *testing.T) {
	const d = 2 * time.Second
	dsn := pgtest.NewDatabase(t)
	s := quietStore(t, dsn)
	ctx := testCtx(t)
	sch := s.schemaIdent()
	delayedGrant(t, s, "p", d)
	// The end without its stamp: a delete outside the Store, so only the
	// reaper stamps it.
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = tx.Exec(ctx, "DELETE FROM "+sch+".locks WHERE key = 'p'"); err != nil {
		t.Fatal(err)
	}
	// An until long past: a pending row keeps the key all the same.
	if _, err := tx.Exec(ctx, "UPDATE "+sch+".delays SET until = clock_timestamp() - interval '1 hour' WHERE key = 'p'"); err != nil {
		t.Fatal(err)
	}
	var beforeCommit time.Time
	if err := tx.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&beforeCommit); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var pending bool
	if err := s.pool.QueryRow(ctx, "SELECT pending_ms IS NOT NULL FROM "+sch+".delays WHERE key = 'p'").Scan(&pending); err != nil || !pending {
		t.Fatalf("the lock-delay after the commit: pending %v, %v; want pending until stamped", pending, err)
	}
	if _, ok, err := s.TryInsert(ctx, openSession(t, s), "p"); err != nil || ok {
		t.Fatalf("TryInsert of a key whose lock-delay is pending = %v, %v; want not acquired", ok, err)
	}
	if info, found, err := s.Inspect(ctx, "p"); err != nil || found || info.DelayRemaining != d {
		t.Fatalf("Inspect of a key whose lock-delay is pending = %+v, found %v, %v; want free with DelayRemaining %v", info, found, err, d)
	}
	newStore(t, dsn) // a reaper that runs: another instance
	testkit.Eventually(t, 30*time.Second, "the reaper stamps the pending lock-delay", func() error {
		var p bool
		if err := s.pool.QueryRow(ctx, "SELECT pending_ms IS NOT NULL FROM "+sch+".delays WHERE key = 'p'").Scan(&p); err != nil {
			return err
		}
		if p {
			return fmt.Errorf("still pending")
		}
		return nil
	})
	if until, _ := delayUntil(t, s, "p"); until.Before(beforeCommit.Add(d)) {
		t.Fatalf("the reaper stamped an end %v after the database clock just before the deleting commit; want at least d = %v", until.Sub(beforeCommit), d)
	}
}
