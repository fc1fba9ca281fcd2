package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockd/internal/pgtest"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testkit"
	"lock.dev/lockd/store"
)

// sentReq is what a lock batch held of one request when it was sent.
type sentReq struct {
	op  lockOp
	id  store.SessionID
	key string
}

// batchRecorder records the lock batches of a Store, in the order they
// were sent.
type batchRecorder struct {
	mu      sync.Mutex
	batches [][]sentReq
}

func (r *batchRecorder) record(batch []*lockReq) {
	b := make([]sentReq, len(batch))
	for i, q := range batch {
		b[i] = sentReq{op: q.op, id: q.id, key: q.key}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, b)
}

// sent returns the batches so far and how many requests they hold.
func (r *batchRecorder) sent() ([][]sentReq, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, b := range r.batches {
		n += len(b)
	}
	return slices.Clone(r.batches), n
}

// gcStore opens a Store that records its lock batches and metrics.
func gcStore(t *testing.T) (*Store, *batchRecorder, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	metrics, err := telemetry.NewMetrics(reg, "pg")
	if err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
	rec := &batchRecorder{}
	s, err := New(testCtx(t), Options{DSN: pgtest.NewDatabase(t), ReaperInterval: testReaperInterval,
		Metrics: metrics, onLockBatch: rec.record})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, rec, reg
}

// blockTable holds a lock on a table of s's schema that makes every write
// to it wait, until the returned function releases it. Reads go on.
func blockTable(t *testing.T, s *Store, table string) (release func()) {
	t.Helper()
	tx, err := s.pool.Begin(testCtx(t))
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	if _, err := tx.Exec(testCtx(t), "LOCK TABLE "+s.schemaIdent()+"."+table+" IN SHARE ROW EXCLUSIVE MODE"); err != nil {
		_ = tx.Rollback(context.Background())
		t.Fatalf("lock table %s: %v", table, err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := tx.Rollback(context.Background()); err != nil {
				t.Errorf("release table %s: %v", table, err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

// waitAllSubmitted polls until n lock requests are either in a batch that
// was sent or queued.
func waitAllSubmitted(t *testing.T, s *Store, rec *batchRecorder, n int) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, "every request sent or queued", func() error {
		_, sent := rec.sent()
		if q := s.lockQ.queued(); sent+q != n {
			return fmt.Errorf("%d sent, %d queued, want %d in all", sent, q, n)
		}
		return nil
	})
}

// waitSent polls until n lock requests were sent in batches.
func waitSent(t *testing.T, rec *batchRecorder, n int) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, "requests sent", func() error {
		if _, sent := rec.sent(); sent != n {
			return fmt.Errorf("%d sent, want %d", sent, n)
		}
		return nil
	})
}

// batchSizes reads lockd_backend_batch_size of kind: how many batches and
// how many requests in all.
func batchSizes(t *testing.T, reg *prometheus.Registry, kind string) (batches, requests float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lockd_backend_batch_size" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "batch" && l.GetValue() == kind {
					batches += float64(m.GetHistogram().GetSampleCount())
					requests += m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return batches, requests
}

// TestGroupCommitGrantsAndReleases holds the locks table so that concurrent
// grants pile up, then lets them go: they commit in far fewer batches than
// requests, every one granted with its own token; the releases likewise.
// Granting the keys again gives larger tokens.
func TestGroupCommitGrantsAndReleases(t *testing.T) {
	t.Parallel()
	s, rec, reg := gcStore(t)
	const n = 40
	ids := make([]store.SessionID, n)
	for i := range ids {
		ids[i] = openSession(t, s)
	}
	key := func(i int) string { return fmt.Sprintf("gc/%02d", i) }

	release := blockTable(t, s, "locks")
	grants := make([]store.Grant, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ok bool
			grants[i], ok, errs[i] = s.TryInsert(testCtx(t), ids[i], key(i))
			if errs[i] == nil && !ok {
				errs[i] = errors.New("not acquired")
			}
		}()
	}
	waitAllSubmitted(t, s, rec, n)
	release()
	wg.Wait()
	tokens := map[uint64]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("TryInsert(%s): %v", key(i), errs[i])
		}
		g := grants[i]
		if g.Key != key(i) || g.Session != ids[i] || g.Token == 0 || g.Remaining <= 0 || g.AcquiredAt.IsZero() {
			t.Fatalf("TryInsert(%s) = %+v; want a full grant for %s", key(i), g, ids[i])
		}
		if tokens[g.Token] {
			t.Fatalf("token %d granted twice", g.Token)
		}
		tokens[g.Token] = true
		if info, found, err := s.Inspect(testCtx(t), key(i)); err != nil || !found || info.Token != g.Token || info.Session != ids[i] {
			t.Fatalf("Inspect(%s) = %+v, %v, %v; want the grant %d", key(i), info, found, err, g.Token)
		}
	}
	batches, _ := rec.sent()
	if len(batches) > lockWorkers+1 {
		t.Fatalf("%d grants went out in %d batches, want at most %d", n, len(batches), lockWorkers+1)
	}
	if b, r := batchSizes(t, reg, telemetry.BatchLocks); b != float64(len(batches)) || r != n {
		t.Fatalf("lockd_backend_batch_size{batch=locks}: %v batches of %v requests, want %d of %d", b, r, len(batches), n)
	}

	release = blockTable(t, s, "locks")
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.DeleteIfOwner(testCtx(t), ids[i], key(i), grants[i].Token)
		}()
	}
	waitAllSubmitted(t, s, rec, 2*n)
	release()
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("DeleteIfOwner(%s): %v", key(i), errs[i])
		}
	}
	if n := count(t, s, "locks"); n != 0 {
		t.Fatalf("%d locks left after the releases, want 0", n)
	}
	all, _ := rec.sent()
	if got := len(all) - len(batches); got > lockWorkers+1 {
		t.Fatalf("%d releases went out in %d batches, want at most %d", n, got, lockWorkers+1)
	}
	for i := range n {
		g := mustTry(t, s, ids[(i+1)%n], key(i))
		if g.Token <= grants[i].Token {
			t.Fatalf("regrant of %s: token %d, want > %d", key(i), g.Token, grants[i].Token)
		}
	}
}

// TestGroupCommitFailuresStayPrivate puts requests that fail (a closed
// session, a stale token) into one batch with good ones: each gets its
// own answer.
func TestGroupCommitFailuresStayPrivate(t *testing.T) {
	t.Parallel()
	s, rec, _ := gcStore(t)
	live := []store.SessionID{openSession(t, s), openSession(t, s), openSession(t, s)}
	dead := openSession(t, s)
	if _, err := s.CloseSession(testCtx(t), dead); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	held := mustTry(t, s, live[0], "fp/held")
	_, before := rec.sent()

	// Two requests occupy both workers, so the rest form one batch.
	release := blockTable(t, s, "locks")
	plugs := make(chan error, lockWorkers)
	for i := range lockWorkers {
		go func() {
			_, _, err := s.TryInsert(testCtx(t), live[0], fmt.Sprintf("fp/plug%d", i))
			plugs <- err
		}()
		waitSent(t, rec, before+i+1) // one plug per batch
	}
	before += lockWorkers
	type res struct {
		g   store.Grant
		ok  bool
		err error
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		got   = map[string]res{}
		calls = map[string]func() res{
			"fp/a": func() res { g, ok, err := s.TryInsert(testCtx(t), live[0], "fp/a"); return res{g, ok, err} },
			"fp/b": func() res { g, ok, err := s.TryInsert(testCtx(t), live[1], "fp/b"); return res{g, ok, err} },
			"fp/c": func() res { g, err := s.Acquire(testCtx(t), live[2], "fp/c"); return res{g, err == nil, err} },
			"fp/dead": func() res {
				g, ok, err := s.TryInsert(testCtx(t), dead, "fp/dead")
				return res{g, ok, err}
			},
			"fp/held": func() res {
				return res{err: s.DeleteIfOwner(testCtx(t), live[0], "fp/held", held.Token+1)}
			},
		}
	)
	for k, call := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := call()
			mu.Lock()
			got[k] = r
			mu.Unlock()
		}()
	}
	waitAllSubmitted(t, s, rec, before+len(calls))
	release()
	wg.Wait()
	for range lockWorkers {
		if err := <-plugs; err != nil {
			t.Fatalf("plug: %v", err)
		}
	}

	for _, k := range []string{"fp/a", "fp/b", "fp/c"} {
		if r := got[k]; r.err != nil || !r.ok || r.g.Key != k || r.g.Token == 0 {
			t.Errorf("grant of %s = %+v; want granted", k, r)
		}
	}
	if r := got["fp/dead"]; !errors.Is(r.err, store.ErrSessionDead) {
		t.Errorf("TryInsert by a closed session = %+v; want ErrSessionDead", r)
	}
	if r := got["fp/held"]; !errors.Is(r.err, store.ErrNotOwner) {
		t.Errorf("DeleteIfOwner with a stale token = %v; want ErrNotOwner", r.err)
	}
	if info, found := inspectT(t, s, "fp/held"); !found || info.Token != held.Token {
		t.Errorf("fp/held after the refused release = %+v, %v; want intact", info, found)
	}
	if _, found := inspectT(t, s, "fp/dead"); found {
		t.Error("the closed session's key was written")
	}
	// They all shared one batch.
	batches, _ := rec.sent()
	keys := keysOf(batches[len(batches)-1])
	slices.Sort(keys)
	if want := []string{"fp/a", "fp/b", "fp/c", "fp/dead", "fp/held"}; !slices.Equal(keys, want) {
		t.Fatalf("last batch %v, want one batch of %v", keys, want)
	}
}

// TestGroupCommitSameKeyWaits sends requests for one key while the first
// is in flight: each goes in a batch of its own, in arrival order, so a
// TryInsert that arrives after a waiter does not jump the waiter's queue.
func TestGroupCommitSameKeyWaits(t *testing.T) {
	t.Parallel()
	s, rec, _ := gcStore(t)
	holder, waiter, barger, other := openSession(t, s), openSession(t, s), openSession(t, s), openSession(t, s)

	release := blockTable(t, s, "locks")
	first := make(chan error, 1)
	go func() {
		_, ok, err := s.TryInsert(testCtx(t), holder, "sk/k")
		if err == nil && !ok {
			err = errors.New("not acquired")
		}
		first <- err
	}()
	waitAllSubmitted(t, s, rec, 1)
	acq := make(chan error, 1)
	go func() {
		_, err := s.Acquire(testCtx(t), waiter, "sk/k")
		acq <- err
	}()
	waitAllSubmitted(t, s, rec, 2)
	if q := s.lockQ.queued(); q != 1 {
		t.Fatalf("%d requests queued, want the waiter's (its key is in flight)", q)
	}
	bargeRes := make(chan error, 1)
	go func() {
		_, ok, err := s.TryInsert(testCtx(t), barger, "sk/k")
		if err == nil && ok {
			err = errors.New("acquired")
		}
		bargeRes <- err
	}()
	otherRes := make(chan error, 1)
	go func() {
		_, _, err := s.TryInsert(testCtx(t), other, "sk/other")
		otherRes <- err
	}()
	waitAllSubmitted(t, s, rec, 4)
	release()
	if err := <-first; err != nil {
		t.Fatalf("first TryInsert: %v", err)
	}
	if err := <-bargeRes; err != nil {
		t.Fatalf("TryInsert after a queued waiter: %v; want not acquired", err)
	}
	if err := <-otherRes; err != nil {
		t.Fatalf("TryInsert of another key: %v", err)
	}
	waitersAreT(t, s, "sk/k", []store.SessionID{waiter})

	batches, _ := rec.sent()
	var order []store.SessionID
	for _, b := range batches {
		n := 0
		for _, r := range b {
			if r.key == "sk/k" {
				n++
				order = append(order, r.id)
			}
		}
		if n > 1 {
			t.Fatalf("batch %v holds sk/k %d times", b, n)
		}
	}
	if want := []store.SessionID{holder, waiter, barger}; !slices.Equal(order[:3], want) {
		t.Fatalf("sk/k went out for %v, want %v (arrival order)", order, want)
	}
	info, _ := inspectT(t, s, "sk/k")
	if err := s.DeleteIfOwner(testCtx(t), holder, "sk/k", info.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	if err := <-acq; err != nil {
		t.Fatalf("waiter: %v", err)
	}
}

// TestGroupCommitLoneRequestGoesAtOnce: with nothing else going on, a
// request is sent as a batch of its own while its caller is still the only
// one waiting: nothing holds it back for company.
func TestGroupCommitLoneRequestGoesAtOnce(t *testing.T) {
	t.Parallel()
	s, rec, reg := gcStore(t)
	id := openSession(t, s)
	release := blockTable(t, s, "locks")
	done := make(chan error, 1)
	go func() {
		_, _, err := s.TryInsert(testCtx(t), id, "lone")
		done <- err
	}()
	// The batch is sent (and then waits for the table) with no other
	// request ever submitted.
	waitSent(t, rec, 1)
	if q := s.lockQ.queued(); q != 0 {
		t.Fatalf("%d requests still queued", q)
	}
	batches, _ := rec.sent()
	if len(batches) != 1 || len(batches[0]) != 1 || batches[0][0].key != "lone" {
		t.Fatalf("batches %v, want one batch of the lone request", batches)
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("TryInsert: %v", err)
	}
	if b, r := batchSizes(t, reg, telemetry.BatchLocks); b != 1 || r != 1 {
		t.Fatalf("lockd_backend_batch_size{batch=locks}: %v batches of %v requests, want 1 of 1", b, r)
	}
}

// TestGroupCommitHeartbeats holds the sessions table while heartbeats pile
// up: they share few UPDATEs, each caller gets its own liveness.
func TestGroupCommitHeartbeats(t *testing.T) {
	t.Parallel()
	s, _, reg := gcStore(t)
	const n = 30
	ids := make([]store.SessionID, n)
	for i := range ids {
		ids[i] = openSession(t, s)
	}
	closed := openSession(t, s)
	if _, err := s.CloseSession(testCtx(t), closed); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	release := blockTable(t, s, "sessions")
	type res struct {
		l   store.Liveness
		err error
	}
	results := make([]res, n+2)
	var wg sync.WaitGroup
	for i := range n + 2 {
		id := closed
		if i < n {
			id = ids[i]
		} else if i == n {
			id = ids[0] // the same session twice in one batch
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := s.Heartbeat(testCtx(t), id)
			results[i] = res{l, err}
		}()
	}
	testkit.Eventually(t, 30*time.Second, "every heartbeat sent or queued", func() error {
		b, r := batchSizes(t, reg, telemetry.BatchHeartbeats)
		if q := s.hbQ.queued(); int(r)+q != n+2 || b != heartbeatWorkers {
			return fmt.Errorf("%v batches of %v sent, %d queued", b, r, q)
		}
		return nil
	})
	release()
	wg.Wait()
	for i, r := range results {
		wantLive := i <= n
		if r.err != nil || r.l.Live != wantLive || wantLive && r.l.Remaining != longTTL {
			t.Errorf("heartbeat %d = %+v, %v; want live %v with Remaining = TTL when live", i, r.l, r.err, wantLive)
		}
	}
	if b, r := batchSizes(t, reg, telemetry.BatchHeartbeats); b > heartbeatWorkers+1 || r != n+2 {
		t.Fatalf("lockd_backend_batch_size{batch=heartbeats}: %v batches of %v heartbeats, want at most %d of %d",
			b, r, heartbeatWorkers+1, n+2)
	}
}

// TestGroupCommitCancelledInFlight cancels callers whose requests are in a
// batch that is waiting: they return at once with their context's error,
// and what the batch did for them is undone.
func TestGroupCommitCancelledInFlight(t *testing.T) {
	t.Parallel()
	s, rec, _ := gcStore(t)
	holder, a, b := openSession(t, s), openSession(t, s), openSession(t, s)
	mustTry(t, s, holder, "cf/held")
	_, before := rec.sent()
	release := blockTable(t, s, "locks")
	ctx, cancel := context.WithCancel(testCtx(t))
	errs := make(chan error, 2)
	go func() {
		_, _, err := s.TryInsert(ctx, a, "cf/new")
		errs <- err
	}()
	go func() {
		_, err := s.Acquire(ctx, b, "cf/held")
		errs <- err
	}()
	waitSent(t, rec, before+2)
	cancel()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled call: %v, want context.Canceled", err)
		}
	}
	release()
	testkit.Eventually(t, 30*time.Second, "the cancelled calls' writes are undone", func() error {
		if _, found := inspectT(t, s, "cf/new"); found {
			return errors.New("cf/new still held")
		}
		if n := count(t, s, "waiters"); n != 0 {
			return fmt.Errorf("%d waiter rows", n)
		}
		return nil
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
	ch, err := s.Watch(testCtx(t), "tp/")
	if err != nil {
		t.Fatalf("Watch: %v", err)
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

func keysOf(b []sentReq) []string {
	keys := make([]string, len(b))
	for i, r := range b {
		keys[i] = r.key
	}
	return keys
}

func inspectT(t *testing.T, s *Store, key string) (store.LockInfo, bool) {
	t.Helper()
	info, found, err := s.Inspect(testCtx(t), key)
	if err != nil {
		t.Fatalf("Inspect(%s): %v", key, err)
	}
	return info, found
}

func waitersAreT(t *testing.T, s *Store, key string, want []store.SessionID) {
	t.Helper()
	info, found := inspectT(t, s, key)
	if !found || !slices.Equal(info.Waiters, want) {
		t.Fatalf("Inspect(%s) = %+v, %v; want waiters %v", key, info, found, want)
	}
}

// TestWakeFirstWaiterOnly: a notification that names the key's first waiter
// wakes only that waiter's local Acquire; one that names none wakes them
// all (their queue entries may not be committed yet).
func TestWakeFirstWaiterOnly(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgtest.NewDatabase(t))
	ids := []store.SessionID{"A", "B", "C"}
	ws := make([]*waiter, len(ids))
	for i, id := range ids {
		w, err := s.addWaiter(id, "k")
		if err != nil {
			t.Fatalf("addWaiter: %v", err)
		}
		defer s.removeWaiter(w)
		ws[i] = w
	}
	other, err := s.addWaiter("A", "other")
	if err != nil {
		t.Fatalf("addWaiter: %v", err)
	}
	defer s.removeWaiter(other)
	woken := func() []store.SessionID {
		var got []store.SessionID
		for i, w := range append(ws, other) {
			select {
			case <-w.wake:
				if i < len(ids) {
					got = append(got, ids[i])
				} else {
					got = append(got, "other")
				}
			default:
			}
		}
		return got
	}
	for _, tc := range []struct {
		payload string
		want    []store.SessionID
	}{
		{`[["released","k","H",7,"B"]]`, []store.SessionID{"B"}},
		{`[["expired","k","H",7,null]]`, ids},
		{`[["revoked","k","H",7]]`, ids},
		{`[["dequeued","k",null,null,"C"]]`, []store.SessionID{"C"}},
		{`[["dequeued","k",null,null,null]]`, ids},
		{`[["acquired","k","H",8,"A"]]`, nil},
		{`[{"kind":"expired","session":"H","keys":["x","k"],"tokens":[1,2]}]`, ids},
	} {
		s.dispatch(tc.payload)
		if got := woken(); !slices.Equal(got, tc.want) {
			t.Errorf("dispatch(%s) woke %v, want %v", tc.payload, got, tc.want)
		}
	}
}
