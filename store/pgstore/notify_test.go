package pgstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

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
	_, ch, err := s.WatchFrom(testCtx(t), "", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
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
		_, ch2, err = s.WatchFrom(testCtx(t), "", "")
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
	_, ch, err := s.WatchFrom(testCtx(t), "", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
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

// TestEventPayloads checks the events pgstore sends itself: the triggers'
// format, read back by dispatch, within the payload limit.
func TestEventPayloads(t *testing.T) {
	var grants []store.Grant
	for i := range 500 {
		sess := store.SessionID(fmt.Sprintf("S%d", i/200)) // runs of one session
		grants = append(grants, store.Grant{Key: fmt.Sprintf("k/%d\"\\\n\u00e9", i), Session: sess, Token: uint64(1<<62 + i)})
	}
	grants = append(grants, store.Grant{Key: strings.Repeat("\x01", store.MaxKeyLen), Session: "s", Token: 1})
	payloads := eventPayloads("expired", grants)
	if len(payloads) < 2 {
		t.Fatalf("%d payloads for %d events, want several", len(payloads), len(grants))
	}
	var got []store.Grant
	for _, p := range payloads {
		if len(p) > maxPayload {
			t.Fatalf("payload of %d bytes, limit %d", len(p), maxPayload)
		}
		var ns []notice
		if err := json.Unmarshal([]byte(p), &ns); err != nil {
			t.Fatalf("payload %q: %v", p, err)
		}
		for _, n := range ns {
			if n.Kind != "expired" || len(n.Keys) == 0 || len(n.Keys) != len(n.Tokens) {
				t.Fatalf("event %+v, want expired events of keys with their tokens", n)
			}
			for i, k := range n.Keys {
				got = append(got, store.Grant{Key: k, Session: store.SessionID(n.Session), Token: n.Tokens[i]})
			}
		}
	}
	if !slices.Equal(got, grants) {
		t.Fatalf("decoded events differ from the grants sent")
	}
}

// TestTriggerPayloads makes the triggers send many events in one
// statement, with awkward keys: the watch gets every one intact.
func TestTriggerPayloads(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgtest.NewDatabase(t))
	_, ch, err := s.WatchFrom(testCtx(t), "tp/", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	id := openSession(t, s)
	// 2n events stay within the watch's buffer (the test reads as they
	// come, but a loaded machine may not run it meanwhile). The long key
	// of control characters goes in statements of its own, one event per
	// notification; the others share notifications.
	const n = 101
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("tp/%03d/\"\\\t\u00e9", i)
	}
	keys[n-1] = "tp/" + strings.Repeat("\x01", store.MaxKeyLen-3)
	for _, ks := range [][]string{keys[:n-1], keys[n-1:]} {
		// One statement grants all (the trigger sees them together), one
		// revokes all.
		err = pgx.BeginFunc(testCtx(t), s.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(testCtx(t), "INSERT INTO "+s.schemaIdent()+".locks (key, session_id, token) SELECT k, $2, nextval('"+s.schema+".fencing_token') FROM unnest($1::text[]) AS k", ks, string(id))
			return err
		})
		if err != nil {
			t.Fatalf("grant: %v", err)
		}
		if _, err := s.pool.Exec(testCtx(t), "DELETE FROM "+s.schemaIdent()+".locks WHERE set_config('lockd.reason', 'revoked', true) IS NOT NULL"); err != nil {
			t.Fatalf("revoke: %v", err)
		}
	}
	seen := map[store.EventKind]map[string]bool{store.EventAcquired: {}, store.EventRevoked: {}}
	timeout := time.After(30 * time.Second)
	for len(seen[store.EventAcquired])+len(seen[store.EventRevoked]) < 2*n {
		select {
		case ev := <-ch:
			if ev.Err != nil || seen[ev.Kind] == nil || ev.Session != id || ev.Token == 0 {
				t.Fatalf("event %+v", ev)
			}
			seen[ev.Kind][ev.Key] = true
		case <-timeout:
			t.Fatalf("%d acquired and %d revoked events, want %d of each", len(seen[store.EventAcquired]), len(seen[store.EventRevoked]), n)
		}
	}
	for _, k := range keys {
		if !seen[store.EventAcquired][k] || !seen[store.EventRevoked][k] {
			t.Fatalf("events of %q missing", k)
		}
	}
}

// TestForgedNotifyIgnored: any database user can NOTIFY on the schema's
// channel (its name is predictable). Forged events that claim a standing
// grant ended (released, revoked, expired; in the triggers' array form and
// in pgstore's own object form) reach no watch, so the server's lock-loss
// watch never forgets a grant it must report (issue 11 §7). Real events
// still arrive, in order.
func TestForgedNotifyIgnored(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	s := newStore(t, dsn)
	_, ch, err := s.WatchFrom(testCtx(t), "", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	holder := openSession(t, s)
	g := mustTry(t, s, holder, "k")
	if ev := <-ch; ev.Kind != store.EventAcquired || ev.Key != "k" || ev.Token != g.Token {
		t.Fatalf("first event %+v, want acquired k with token %d", ev, g.Token)
	}
	forger, err := pgx.Connect(testCtx(t), dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer forger.Close(testCtx(t))
	for _, kind := range []string{"released", "revoked", "expired"} {
		for _, payload := range []string{
			fmt.Sprintf(`[[%q,"k",%q,%d,null]]`, kind, holder, g.Token),
			fmt.Sprintf(`[{"kind":%q,"session":%q,"keys":["k"],"tokens":[%d]}]`, kind, holder, g.Token),
		} {
			if _, err := forger.Exec(testCtx(t), `SELECT pg_notify($1, $2)`, s.channel, payload); err != nil {
				t.Fatalf("pg_notify(%s): %v", payload, err)
			}
		}
	}
	// A real change after the forgeries: it must be the next event.
	g2 := mustTry(t, s, holder, "z")
	select {
	case ev := <-ch:
		if ev.Kind != store.EventAcquired || ev.Key != "z" || ev.Token != g2.Token {
			t.Fatalf("event after forged NOTIFYs: %+v; want acquired z (token %d), the forgeries dropped", ev, g2.Token)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event after the forged NOTIFYs and a real grant")
	}
	// A real release of k still arrives.
	if err := s.DeleteIfOwner(testCtx(t), holder, "k", g.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	select {
	case ev := <-ch:
		if ev.Kind != store.EventReleased || ev.Key != "k" || ev.Token != g.Token {
			t.Fatalf("event after the real release: %+v; want released k (token %d)", ev, g.Token)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the real release was not delivered")
	}
}

// TestUnwatchedEventsNotChecked: a notification that no local waiter or
// watch would act on is dropped without checking it against the table
// (issue 24: the check was a query per release at distinct keys); one a
// watch would deliver is checked, unless this Store's own commit ended the
// grant (gone.go: on the old code the watched key's own release was
// checked, "1 notifications checked after the watched key's own release;
// want 0"); another Store's release of a watched key is still checked.
func TestUnwatchedEventsNotChecked(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	s := newStore(t, dsn)
	holder := openSession(t, s)
	g := mustTry(t, s, holder, "a/k")
	if err := s.DeleteIfOwner(testCtx(t), holder, "a/k", g.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	// The watch's sync marker is notified after the release committed, and
	// the listener handles notifications in order: once WatchFrom returns,
	// the release's notification has been handled.
	_, ch, err := s.WatchFrom(testCtx(t), "b/", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	if n := s.standingChecks.Load(); n != 0 {
		t.Fatalf("%d notifications checked against the table after a release nobody waits for or watches; want 0", n)
	}
	g = mustTry(t, s, holder, "b/k")
	if err := s.DeleteIfOwner(testCtx(t), holder, "b/k", g.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	for _, want := range []store.EventKind{store.EventAcquired, store.EventReleased} {
		select {
		case ev := <-ch:
			if ev.Kind != want || ev.Key != "b/k" || ev.Token != g.Token {
				t.Fatalf("watch event %+v; want %v of b/k (token %d)", ev, want, g.Token)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %v event of the watched key", want)
		}
	}
	if n := s.standingChecks.Load(); n != 0 {
		t.Fatalf("%d notifications checked after the watched key's own release; want 0", n)
	}
	// Another Store's release: this Store did not end the grant, so its
	// event is checked.
	other := newStore(t, dsn)
	g = mustTry(t, other, holder, "b/j")
	if err := other.DeleteIfOwner(testCtx(t), holder, "b/j", g.Token); err != nil {
		t.Fatalf("DeleteIfOwner on the other Store: %v", err)
	}
	for _, want := range []store.EventKind{store.EventAcquired, store.EventReleased} {
		select {
		case ev := <-ch:
			if ev.Kind != want || ev.Key != "b/j" || ev.Token != g.Token {
				t.Fatalf("watch event %+v; want %v of b/j (token %d)", ev, want, g.Token)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %v event of the key the other Store released", want)
		}
	}
	if n := s.standingChecks.Load(); n != 1 {
		t.Fatalf("%d notifications checked after another Store's release of a watched key; want 1", n)
	}
}
