package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
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
		if q := s.lockQ.Queued(); sent+q != n {
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

func keysOf(b []sentReq) []string {
	keys := make([]string, len(b))
	for i, r := range b {
		keys[i] = r.key
	}
	return keys
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
		if q := s.hbQ.Queued(); int(r)+q != n+2 || b != heartbeatWorkers {
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

// TestHeartbeatMany (C2 #ct2-heartbeat-many): the renewals of one
// HeartbeatMany call share one UPDATE — with Heartbeat per session from
// concurrent callers the idle worker takes the first alone — and each id
// is answered as Heartbeat would: live with Remaining = TTL, a closed
// session not live, a malformed id invalid, a repeated id live twice.
func TestHeartbeatMany(t *testing.T) {
	t.Parallel()
	s, _, reg := gcStore(t)
	const n = 20
	var ids []store.SessionID
	for range n {
		ids = append(ids, openSession(t, s))
	}
	closed := openSession(t, s)
	if _, err := s.CloseSession(testCtx(t), closed); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	ids = append(ids, closed, "not a session id", ids[0])
	b0, r0 := batchSizes(t, reg, telemetry.BatchHeartbeats)
	lvs, errs := s.HeartbeatMany(testCtx(t), ids)
	if len(lvs) != len(ids) || len(errs) != len(ids) {
		t.Fatalf("HeartbeatMany answered %d, %d of %d ids", len(lvs), len(errs), len(ids))
	}
	for i, id := range ids {
		switch {
		case id == closed:
			if errs[i] != nil || lvs[i].Live {
				t.Errorf("closed session: %+v, %v; want not live, nil", lvs[i], errs[i])
			}
		case id == "not a session id":
			if !errors.Is(errs[i], store.ErrInvalidArgument) {
				t.Errorf("malformed id: %+v, %v; want ErrInvalidArgument", lvs[i], errs[i])
			}
		default:
			if errs[i] != nil || !lvs[i].Live || lvs[i].Remaining != longTTL {
				t.Errorf("id %d: %+v, %v; want live with Remaining = TTL", i, lvs[i], errs[i])
			}
		}
	}
	if b, r := batchSizes(t, reg, telemetry.BatchHeartbeats); b-b0 != 1 || r-r0 != n+2 {
		t.Fatalf("lockd_backend_batch_size{batch=heartbeats}: %v batches of %v heartbeats; want 1 of %d", b-b0, r-r0, n+2)
	}
}

// TestGroupCommitCancelledInFlight cancels callers whose requests are in a
// batch that is waiting: they wait for the batch and return with their
// context's error once it ran and they settled it (C2
// #ct2-leave-after-cut; before issue 21's CUTWAIT-1 fix they returned at
// once and the batch's worker undid later): a queue entry the batch made
// for them is left, and a grant it made is kept, so that a retry through
// another instance gets it back and no late undo frees the key under that
// retry (the old undo failed parity rolling-restart: "Release: not
// owner").
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
	settling := make(chan string, 2)
	s.lockQ.SetSettling(func(key string) { settling <- key })
	t.Cleanup(func() { s.lockQ.SetSettling(nil) })
	cancel()
	for range 2 {
		select {
		case <-settling: // a cancelled call waits for its request's batch
		case err := <-errs:
			release()
			t.Fatalf("a cancelled call returned (%v) while its batch waited; want it to wait for the batch", err)
		case <-time.After(30 * time.Second):
			release()
			t.Fatal("the cancelled calls neither returned nor waited for their batch within 30s")
		}
	}
	release()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled call: %v, want context.Canceled", err)
		}
	}
	// The callers settled their requests before they returned; the rest is
	// read through another instance on the same database.
	other, err := New(testCtx(t), Options{DSN: s.pool.Config().ConnString(), ReaperInterval: testReaperInterval})
	if err != nil {
		t.Fatalf("New on the same database: %v", err)
	}
	t.Cleanup(func() { _ = other.Close() })
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if info, _ := inspectT(t, other, "cf/held"); len(info.Waiters) != 0 {
		t.Errorf("cf/held waiters = %v; want none: the cancelled call left the queue", info.Waiters)
	}
	kept, found := inspectT(t, other, "cf/new")
	if !found || kept.Session != a {
		t.Fatalf("cf/new after its cancelled grant settled = %+v (found %v); want kept, held by the cancelled caller's session", kept, found)
	}
	// A retry through another instance returns the kept grant.
	g, acquired, err := other.TryInsert(testCtx(t), a, "cf/new")
	if err != nil || !acquired || g.Session != a || g.Token != kept.Token {
		t.Fatalf("retry of the cancelled TryInsert on another instance = %+v, %v, %v; want the kept grant (token %d)", g, acquired, err, kept.Token)
	}
}
