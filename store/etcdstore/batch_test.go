package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/etcdtest"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testkit"
	"lock.dev/lockd/store"
)

// gate records every batch a Store sends and can hold the committers: the
// first `hold` batches wait in the hook until open is called, so requests
// made meanwhile queue up behind them.
type gate struct {
	hold    int
	entered chan struct{} // one value per held batch
	opened  chan struct{}
	once    sync.Once

	mu      sync.Mutex
	batches [][]string
}

func newGate(hold int) *gate {
	return &gate{hold: hold, entered: make(chan struct{}, hold), opened: make(chan struct{})}
}

func (g *gate) hook(keys []string) {
	g.mu.Lock()
	g.batches = append(g.batches, keys)
	n := len(g.batches)
	g.mu.Unlock()
	if n <= g.hold {
		g.entered <- struct{}{}
		<-g.opened
	}
}

func (g *gate) open() { g.once.Do(func() { close(g.opened) }) }

// waitHeld waits until one more batch is held.
func (g *gate) waitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no batch held within 30s")
	}
}

func (g *gate) recorded() [][]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.batches)
}

// metricStore returns a Store recording metrics, and its registry.
func metricStore(t *testing.T) (*Store, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	met, err := telemetry.NewMetrics(reg, Backend)
	if err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
	st, err := New(ctxT(t), etcdtest.NewClient(t), Options{Prefix: etcdtest.Prefix(t), Metrics: met})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st, reg
}

// setGate makes every later batch of st pass through g; g is opened when
// the test ends, before the Store is closed.
func setGate(t *testing.T, st *Store, g *gate) {
	t.Cleanup(g.open)
	st.batch.mu.Lock()
	st.batch.hookFn = g.hook
	st.batch.mu.Unlock()
}

// queued is how many requests wait in the Store's queue.
func queued(st *Store) int {
	st.batch.mu.Lock()
	defer st.batch.mu.Unlock()
	n := 0
	for _, r := range st.batch.queue {
		if r.state.Load() == reqQueued {
			n++
		}
	}
	return n
}

// waitQueued polls until n requests wait in the queue.
func waitQueued(t *testing.T, st *Store, n int) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%d requests queued", n), func() error {
		if got := queued(st); got != n {
			return fmt.Errorf("%d queued", got)
		}
		return nil
	})
}

// hold fills both committers with one TryInsert each on keys of their own
// and waits until they are held in the gate. The returned function waits for
// those two calls.
func hold(t *testing.T, st *Store, g *gate, id store.SessionID) func() {
	t.Helper()
	var wg sync.WaitGroup
	for i := range maxInflight {
		wg.Add(1)
		go func() { // exits when its TryInsert returns (after g.open)
			defer wg.Done()
			if _, ok, err := st.TryInsert(ctxT(t), id, fmt.Sprintf("held/%d", i)); err != nil || !ok {
				t.Errorf("TryInsert(held/%d) = %v, %v; want a grant", i, ok, err)
			}
		}()
		g.waitHeld(t) // one committer took it and is held
	}
	return wg.Wait
}

// batchMetric reads lockd_backend_batch_size{batch="locks"}: how many
// batches were observed and how many requests they held.
func batchMetric(t *testing.T, reg *prometheus.Registry) (batches, requests uint64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lockd_backend_batch_size" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "batch" && l.GetValue() == telemetry.BatchLocks {
					return m.GetHistogram().GetSampleCount(), uint64(m.GetHistogram().GetSampleSum())
				}
			}
		}
	}
	return 0, 0
}

// TestGroupCommitBatches: grants and releases on distinct keys made while
// the committers are busy share commits, and every caller gets its own
// right answer: a grant whose token is its key's revision, a release that
// deleted exactly its key.
func TestGroupCommitBatches(t *testing.T) {
	const n = 40
	g := newGate(maxInflight)
	st, reg := metricStore(t)
	setGate(t, st, g)
	id := openSession(t, st, 10*time.Second)
	heldDone := hold(t, st, g, id)

	type result struct {
		g   store.Grant
		ok  bool
		err error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { // exits when its TryInsert returns
			defer wg.Done()
			r := &results[i]
			r.g, r.ok, r.err = st.TryInsert(ctxT(t), id, fmt.Sprintf("k/%02d", i))
		}()
	}
	waitQueued(t, st, n)
	g.open()
	wg.Wait()
	heldDone()

	cli := etcdtest.NewClient(t)
	for i, r := range results {
		key := fmt.Sprintf("k/%02d", i)
		if r.err != nil || !r.ok || r.g.Key != key || r.g.Session != id {
			t.Fatalf("TryInsert(%s) = %+v, %v, %v; want a grant of %s to %s", key, r.g, r.ok, r.err, key, id)
		}
		resp, err := cli.Get(ctxT(t), st.lockKey(key))
		if err != nil || len(resp.Kvs) != 1 || uint64(resp.Kvs[0].ModRevision) != r.g.Token {
			t.Fatalf("grant key of %s = %v, %v; want one with mod revision = token %d", key, resp, err, r.g.Token)
		}
	}
	batches, requests := batchMetric(t, reg)
	if requests != n+maxInflight || batches >= requests || batches > maxInflight+2 {
		t.Fatalf("lockd_backend_batch_size: %d batches of %d requests in all; want %d requests in at most %d batches (recorded %v)",
			batches, requests, n+maxInflight, maxInflight+2, g.recorded())
	}

	// Releases, batched the same way.
	g2 := newGate(maxInflight)
	setGate(t, st, g2)
	heldDone = hold(t, st, g2, id) // held/0 and held/1 are held already: granted again, no write
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() { // exits when its DeleteIfOwner returns
			defer wg.Done()
			errs[i] = st.DeleteIfOwner(ctxT(t), id, results[i].g.Key, results[i].g.Token)
		}()
	}
	waitQueued(t, st, n)
	g2.open()
	wg.Wait()
	heldDone()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("DeleteIfOwner of the batched grants: %v", err)
	}
	if got := lockKeys(t, cli, st.prefix); !slices.Equal(got, []string{"held/0", "held/1"}) {
		t.Fatalf("grant keys after releasing the batched ones: %v, want only held/0 and held/1", got)
	}
	// Nobody was queued: each release took one request (no pre-read).
	b2, r2 := batchMetric(t, reg)
	if r2-requests != n+maxInflight || b2-batches > maxInflight+2 {
		t.Fatalf("releases: %d batches of %d requests; want %d requests in at most %d batches (recorded %v)",
			b2-batches, r2-requests, n+maxInflight, maxInflight+2, g2.recorded())
	}
}

// TestGroupCommitDeadSession: a batch holding a request of a session whose
// lease is gone fails as a whole in etcd; the Store then commits its
// requests one by one, so that caller gets ErrSessionDead and the others
// their grants.
func TestGroupCommitDeadSession(t *testing.T) {
	g := newGate(maxInflight)
	st, _ := metricStore(t)
	setGate(t, st, g)
	alive := openSession(t, st, 10*time.Second)
	dead := openSession(t, st, 10*time.Second)
	heldDone := hold(t, st, g, alive)

	type result struct {
		ok  bool
		err error
	}
	reqs := []struct {
		id  store.SessionID
		key string
	}{{alive, "a1"}, {dead, "d"}, {alive, "a2"}, {alive, "a3"}}
	results := make([]result, len(reqs))
	var wg sync.WaitGroup
	for i, rq := range reqs {
		wg.Add(1)
		go func() { // exits when its TryInsert returns
			defer wg.Done()
			_, results[i].ok, results[i].err = st.TryInsert(ctxT(t), rq.id, rq.key)
		}()
	}
	waitQueued(t, st, len(reqs))
	// The lease goes while the requests wait: the Store cannot know yet.
	revokeLease(t, etcdtest.NewClient(t), st, dead)
	g.open()
	wg.Wait()
	heldDone()

	for i, rq := range reqs {
		r := results[i]
		if rq.id == dead {
			if !errors.Is(r.err, store.ErrSessionDead) {
				t.Fatalf("TryInsert(%s) of the session whose lease is gone = %v, %v; want ErrSessionDead", rq.key, r.ok, r.err)
			}
			continue
		}
		if r.err != nil || !r.ok {
			t.Fatalf("TryInsert(%s) of a live session batched with a dead one = %v, %v; want a grant", rq.key, r.ok, r.err)
		}
	}
	var sawAll bool
	for _, b := range g.recorded() {
		if len(b) == len(reqs) {
			sawAll = true
		}
	}
	if !sawAll {
		t.Fatalf("batches %v: none held all %d requests, so the split was not exercised", g.recorded(), len(reqs))
	}
	if got := lockKeys(t, etcdtest.NewClient(t), st.prefix); !slices.Equal(got, []string{"a1", "a2", "a3", "held/0", "held/1"}) {
		t.Fatalf("grant keys = %v; want a1 a2 a3 held/0 held/1", got)
	}
	if l, err := st.Heartbeat(ctxT(t), dead); err != nil || l.Live {
		t.Fatalf("Heartbeat of the dead session = %+v, %v; want not live", l, err)
	}
}

// TestGroupCommitSameKey: requests for one key never share a batch, and
// they are committed in arrival order.
func TestGroupCommitSameKey(t *testing.T) {
	g := newGate(maxInflight)
	st, _ := metricStore(t)
	setGate(t, st, g)
	a := openSession(t, st, 10*time.Second)
	b := openSession(t, st, 10*time.Second)
	heldDone := hold(t, st, g, a)

	type result struct {
		g   store.Grant
		ok  bool
		err error
	}
	reqs := []struct {
		id  store.SessionID
		key string
	}{{a, "x"}, {b, "x"}, {b, "y"}, {a, "x"}, {a, "z"}}
	results := make([]result, len(reqs))
	var wg sync.WaitGroup
	for i, rq := range reqs {
		wg.Add(1)
		go func() { // exits when its TryInsert returns
			defer wg.Done()
			r := &results[i]
			r.g, r.ok, r.err = st.TryInsert(ctxT(t), rq.id, rq.key)
		}()
		waitQueued(t, st, i+1) // arrival order is the order of reqs
	}
	g.open()
	wg.Wait()
	heldDone()

	for _, bt := range g.recorded() {
		seen := map[string]bool{}
		for _, k := range bt {
			if seen[k] {
				t.Fatalf("batch %v holds key %q twice", bt, k)
			}
			seen[k] = true
		}
	}
	// a's x arrived first: it is granted; b's x then finds it held; a's
	// second x is the idempotent "already mine".
	first, second, again := results[0], results[1], results[3]
	if first.err != nil || !first.ok {
		t.Fatalf("first TryInsert(x) by a = %v, %v; want a grant", first.ok, first.err)
	}
	if second.err != nil || second.ok || second.g.Session != a || second.g.Token != first.g.Token {
		t.Fatalf("TryInsert(x) by b after a = %+v, %v, %v; want not acquired, held by a with token %d", second.g, second.ok, second.err, first.g.Token)
	}
	if again.err != nil || !again.ok || again.g.Token != first.g.Token {
		t.Fatalf("second TryInsert(x) by a = %+v, %v, %v; want its grant again (token %d)", again.g, again.ok, again.err, first.g.Token)
	}
	for _, i := range []int{2, 4} {
		if r := results[i]; r.err != nil || !r.ok {
			t.Fatalf("TryInsert(%s) = %v, %v; want a grant", reqs[i].key, r.ok, r.err)
		}
	}
}

// TestGroupCommitIdleNoLinger: on an idle Store a request is sent at once,
// alone: the committer has no timer; it sends what is queued as soon as it
// is free. The gate holds the batch as it is sent, with nothing else ever
// queued, so the request cannot have waited for company.
func TestGroupCommitIdleNoLinger(t *testing.T) {
	g := newGate(1)
	st, reg := metricStore(t)
	setGate(t, st, g)
	id := openSession(t, st, 10*time.Second)
	done := make(chan error, 1)
	go func() { // exits when TryInsert returns
		_, _, err := st.TryInsert(ctxT(t), id, "solo")
		done <- err
	}()
	g.waitHeld(t) // sent with only this request ever queued
	if got := g.recorded(); len(got) != 1 || !slices.Equal(got[0], []string{"solo"}) {
		t.Fatalf("batches sent for one request on an idle store: %v, want [[solo]]", got)
	}
	if n := queued(st); n != 0 {
		t.Fatalf("%d requests still queued while the only one is being sent", n)
	}
	g.open()
	if err := <-done; err != nil {
		t.Fatalf("TryInsert(solo): %v", err)
	}
	if batches, requests := batchMetric(t, reg); batches != 1 || requests != 1 {
		t.Fatalf("lockd_backend_batch_size: %d batches of %d requests, want one batch of one", batches, requests)
	}
	// A release with nobody queued is one commit.
	g2 := newGate(0)
	setGate(t, st, g2)
	info, _, err := st.Inspect(ctxT(t), "solo")
	if err != nil {
		t.Fatalf("Inspect(solo): %v", err)
	}
	if err := st.DeleteIfOwner(ctxT(t), id, "solo", info.Token); err != nil {
		t.Fatalf("DeleteIfOwner(solo): %v", err)
	}
	if got := g2.recorded(); len(got) != 1 {
		t.Fatalf("commits of a release with nobody queued: %v, want exactly one", got)
	}
}

// TestGroupCommitCallerGivesUp: a request whose caller's ctx ends before it
// is sent is dropped; an Acquire whose ctx ends while its request is in
// flight leaves the queue once the outcome is known, and a grant it made
// stays (a retry returns it) and is counted as held.
func TestGroupCommitCallerGivesUp(t *testing.T) {
	g := newGate(maxInflight)
	st, _ := metricStore(t)
	id := openSession(t, st, 10*time.Second)
	other := openSession(t, st, 10*time.Second)
	mustTry(t, st, other, "taken")
	setGate(t, st, g)
	heldDone := hold(t, st, g, id)

	// Before it is sent.
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() { // exits when TryInsert returns
		_, _, err := st.TryInsert(ctx, id, "dropped")
		done <- err
	}()
	waitQueued(t, st, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("TryInsert cancelled while queued: %v, want context.Canceled", err)
	}
	g.open()
	heldDone()
	for _, b := range g.recorded() {
		if slices.Contains(b, "dropped") {
			t.Fatalf("batch %v sent the request of a caller that had given up", b)
		}
	}

	// In flight: the gate holds the batch after it was taken.
	for _, key := range []string{"free", "taken"} {
		g3 := newGate(1)
		setGate(t, st, g3)
		ctx, cancel := context.WithCancel(ctxT(t))
		done := make(chan error, 1)
		go func() { // exits when Acquire returns
			_, err := st.Acquire(ctx, id, key)
			done <- err
		}()
		g3.waitHeld(t)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire(%s) cancelled in flight: %v, want context.Canceled", key, err)
		}
		g3.open()
		if key == "free" {
			testkit.Eventually(t, 10*time.Second, "the abandoned Acquire(free)'s grant recorded", func() error {
				st.mu.Lock()
				defer st.mu.Unlock()
				if _, ok := st.sessions[id].held["free"]; !ok {
					return errors.New("not recorded")
				}
				return nil
			})
			info, found, err := st.Inspect(ctxT(t), key)
			if err != nil || !found || info.Session != id {
				t.Fatalf("Inspect(free) after the abandoned Acquire = %+v, %v, %v; want granted to its session", info, found, err)
			}
			if g, err := st.Acquire(ctxT(t), id, key); err != nil || g.Token != info.Token {
				t.Fatalf("retried Acquire(free) = %+v, %v; want the same grant (token %d)", g, err, info.Token)
			}
			continue
		}
		testkit.Eventually(t, 10*time.Second, "the abandoned Acquire(taken) left the queue", func() error {
			info, _, err := st.Inspect(ctxT(t), key)
			if err == nil && len(info.Waiters) > 0 {
				err = fmt.Errorf("waiters %v", info.Waiters)
			}
			return err
		})
	}
	if info, found, err := st.Inspect(ctxT(t), "taken"); err != nil || !found || info.Session != other {
		t.Fatalf("Inspect(taken) = %+v, %v, %v; want still held by the other session", info, found, err)
	}
	// A TryInsert given up on in flight leaves its grant (a retry returns
	// it), and the Store records it so CloseSession counts it.
	g4 := newGate(1)
	setGate(t, st, g4)
	ctx4, cancel4 := context.WithCancel(ctxT(t))
	done4 := make(chan error, 1)
	go func() { // exits when TryInsert returns
		_, _, err := st.TryInsert(ctx4, id, "orphan")
		done4 <- err
	}()
	g4.waitHeld(t)
	cancel4()
	if err := <-done4; !errors.Is(err, context.Canceled) {
		t.Fatalf("TryInsert(orphan) cancelled in flight: %v, want context.Canceled", err)
	}
	g4.open()
	testkit.Eventually(t, 10*time.Second, "the abandoned TryInsert's grant recorded", func() error {
		st.mu.Lock()
		defer st.mu.Unlock()
		if _, ok := st.sessions[id].held["orphan"]; !ok {
			return errors.New("not recorded")
		}
		return nil
	})
	mustTry(t, st, id, "after")
	// held/0, held/1, free, orphan, after.
	if n, err := st.CloseSession(ctxT(t), id); err != nil || n != 5 {
		t.Fatalf("CloseSession = %d, %v; want 5 grants, nil", n, err)
	}
	if got := lockKeys(t, etcdtest.NewClient(t), st.prefix); !slices.Equal(got, []string{"taken"}) {
		t.Fatalf("grant keys after CloseSession: %v, want only the other session's", got)
	}
}

// BenchmarkGrantRelease measures TryInsert + DeleteIfOwner pairs on
// distinct keys at several concurrencies, next to the raw etcd pair (Txn
// put-if-absent with a lease, Delete) on the same server:
//
//	go test -run '^$' -bench GrantRelease -benchtime 3s ./store/etcdstore/
func BenchmarkGrantRelease(b *testing.B) {
	for _, c := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("store/c=%d", c), func(b *testing.B) {
			st := newStore(b, etcdtest.NewClient(b), etcdtest.Prefix(b), nil)
			ids := make([]store.SessionID, c)
			for i := range ids {
				ids[i] = openSession(b, st, 15*time.Second)
			}
			runPairs(b, c, func(ctx context.Context, w, i int) error {
				key := fmt.Sprintf("w%d/%d", w, i)
				g, ok, err := st.TryInsert(ctx, ids[w], key)
				if err != nil || !ok {
					return fmt.Errorf("TryInsert(%s) = %v, %v", key, ok, err)
				}
				return st.DeleteIfOwner(ctx, ids[w], key, g.Token)
			})
		})
		b.Run(fmt.Sprintf("raw/c=%d", c), func(b *testing.B) {
			cli := etcdtest.NewClient(b)
			prefix := etcdtest.Prefix(b)
			lease, err := cli.Grant(ctxT(b), 15)
			if err != nil {
				b.Fatalf("Grant: %v", err)
			}
			runPairs(b, c, func(ctx context.Context, w, i int) error {
				key := fmt.Sprintf("%sw%d/%d", prefix, w, i)
				resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
					Then(clientv3.OpPut(key, "x", clientv3.WithLease(lease.ID))).Commit()
				if err != nil || !resp.Succeeded {
					return fmt.Errorf("Txn(%s) = %v, %v", key, resp, err)
				}
				_, err = cli.Delete(ctx, key)
				return err
			})
		})
	}
}

// runPairs runs b.N calls of pair spread over c workers.
func runPairs(b *testing.B, c int, pair func(ctx context.Context, worker, i int) error) {
	b.Helper()
	ctx := ctxT(b)
	var (
		wg   sync.WaitGroup
		next atomic.Int64
		errs = make([]error, c)
	)
	b.ResetTimer()
	for w := range c {
		wg.Add(1)
		go func() { // exits after the last pair
			defer wg.Done()
			for i := int(next.Add(1)); i <= b.N; i = int(next.Add(1)) {
				if err := pair(ctx, w, i); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
}

// TestGroupCommitTimeout: a commit etcd does not answer ends after
// commitTimeout with a retryable error that is not the caller's own ctx
// error, while the caller's ctx is still alive.
func TestGroupCommitTimeout(t *testing.T) {
	p := etcdtest.NewProxy(t)
	st := newStore(t, etcdtest.NewClient(t, etcdtest.ProxyEndpoint(p)), etcdtest.Prefix(t), nil)
	id := openSession(t, st, 30*time.Second)
	p.Pause()
	defer p.Restore()
	ctx, cancel := context.WithTimeout(ctxT(t), 4*commitTimeout)
	defer cancel()
	_, _, err := st.TryInsert(ctx, id, "k")
	if ctx.Err() != nil {
		t.Fatalf("TryInsert during a pause returned only after the caller's ctx ended: %v", err)
	}
	if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Fatalf("TryInsert during a pause: %v; want ErrUnavailable without a context error in its chain", err)
	}
	p.Restore()
	testkit.Eventually(t, 30*time.Second, "a grant once etcd answers again", func() error {
		_, ok, err := st.TryInsert(ctxT(t), id, "k")
		if err == nil && !ok {
			err = errors.New("not acquired")
		}
		return err
	})
}

// TestReleaseCommits: how many commits a release costs. Nobody queued: one.
// A waiter queued through another Store instance: two (the owner check that
// reads the first waiter, then the hand-over), unless the holder itself
// waited for its grant: then the first waiter is read with a plain read and
// the hand-over is the only commit. A waiter queued through this Store: one
// (the hand-over checks the guess).
func TestReleaseCommits(t *testing.T) {
	st, _ := metricStore(t)
	other := newStore(t, etcdtest.NewClient(t), st.prefix, nil)
	a := openSession(t, st, 10*time.Second)
	b := openSession(t, other, 10*time.Second)
	c := openSession(t, other, 10*time.Second)
	d := openSession(t, st, 10*time.Second)
	// commits counts the batches st sends while fn runs.
	commits := func(fn func()) int {
		g := newGate(0)
		setGate(t, st, g)
		fn()
		return len(g.recorded())
	}
	// queue starts Acquire(k) for id through in and waits until it is
	// queued.
	queue := func(in *Store, id store.SessionID) <-chan error {
		done := make(chan error, 1)
		go func() { // exits when Acquire returns
			_, err := in.Acquire(ctxT(t), id, "k")
			done <- err
		}()
		testkit.Eventually(t, 30*time.Second, "queued", func() error {
			info, _, err := st.Inspect(ctxT(t), "k")
			if err == nil && !slices.Contains(info.Waiters, id) {
				err = errors.New("not queued yet")
			}
			return err
		})
		return done
	}
	release := func(in *Store, id store.SessionID) {
		info, _, err := st.Inspect(ctxT(t), "k")
		if err != nil || info.Session != id {
			t.Fatalf("Inspect(k) = %+v, %v; want held by %s", info, err, id)
		}
		if err := in.DeleteIfOwner(ctxT(t), id, "k", info.Token); err != nil {
			t.Fatalf("DeleteIfOwner(k) by %s: %v", id, err)
		}
	}
	granted := func(what string, done <-chan error) {
		if err := <-done; err != nil {
			t.Fatalf("Acquire(k) by %s: %v", what, err)
		}
	}

	if n := commits(func() { mustTry(t, st, a, "k") }); n != 1 {
		t.Fatalf("TryInsert on a free key: %d commits, want 1", n)
	}
	bDone := queue(other, b)
	if n := commits(func() { release(st, a) }); n != 2 {
		t.Fatalf("release of a grant taken at once, waiter of another instance: %d commits, want 2", n)
	}
	granted("b", bDone)
	aDone := queue(st, a)
	release(other, b)
	granted("a", aDone)
	cDone := queue(other, c)
	if n := commits(func() { release(st, a) }); n != 1 {
		t.Fatalf("release of a grant waited for, waiter of another instance: %d commits, want 1 (the hand-over)", n)
	}
	granted("c", cDone)
	dDone := queue(st, d)
	release(other, c)
	granted("d", dDone)
	aDone = queue(st, a)
	if n := commits(func() { release(st, d) }); n != 1 {
		t.Fatalf("release with a waiter of this instance: %d commits, want 1 (the hand-over)", n)
	}
	granted("a", aDone)
	if n := commits(func() { release(st, a) }); n != 1 {
		t.Fatalf("release of a grant waited for, nobody queued: %d commits, want 1", n)
	}
	// Taken at once (no hint), a waiter of this instance: only the guess
	// makes it one commit.
	mustTry(t, st, a, "k")
	dDone = queue(st, d)
	waitLocal(t, st, "k", 1, true)
	if n := commits(func() { release(st, a) }); n != 1 {
		t.Fatalf("release of a grant taken at once, waiter of this instance: %d commits, want 1 (the hand-over)", n)
	}
	granted("d", dDone)
	release(st, d)
	if _, found, err := st.Inspect(ctxT(t), "k"); err != nil || found {
		t.Fatalf("Inspect(k) after the last release = found %v, %v; want free", found, err)
	}
}

// waitLocal polls until n Acquire calls of st wait for key in its queue
// and, if first, one of them has seen itself first in line.
func waitLocal(t *testing.T, st *Store, key string, n int, first bool) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, "local waiters registered", func() error {
		st.waiters.mu.Lock()
		defer st.waiters.mu.Unlock()
		ws := st.waiters.byKey[key]
		if len(ws) != n {
			return fmt.Errorf("%d local waiters", len(ws))
		}
		if first && !slices.ContainsFunc(ws, func(w *localWaiter) bool { return w.first }) {
			return errors.New("none has seen itself first in line")
		}
		return nil
	})
}

// TestReleaseGuessNotFirst: a wrong guess of the first in line (here a
// waiter of this Store marked first by hand, while an older waiter came
// through another instance) does not give the key out of turn: the
// hand-over's check fails and the key goes to the true first.
func TestReleaseGuessNotFirst(t *testing.T) {
	st := newStore(t, etcdtest.NewClient(t), etcdtest.Prefix(t), nil)
	other := newStore(t, etcdtest.NewClient(t), st.prefix, nil)
	holder := openSession(t, st, 10*time.Second)
	first := openSession(t, other, 10*time.Second)
	second := openSession(t, st, 10*time.Second)
	g := mustTry(t, st, holder, "k")
	type res struct {
		g   store.Grant
		err error
	}
	acquire := func(in *Store, id store.SessionID) <-chan res {
		ch := make(chan res, 1)
		go func() { // exits when Acquire returns
			g, err := in.Acquire(ctxT(t), id, "k")
			ch <- res{g, err}
		}()
		testkit.Eventually(t, 30*time.Second, "queued", func() error {
			info, _, err := st.Inspect(ctxT(t), "k")
			if err == nil && !slices.Contains(info.Waiters, id) {
				err = errors.New("not queued yet")
			}
			return err
		})
		return ch
	}
	firstDone := acquire(other, first)
	secondDone := acquire(st, second)
	waitLocal(t, st, "k", 1, false)
	st.waiters.mu.Lock()
	st.waiters.byKey["k"][0].first = true // a stale view: the guess will be second
	st.waiters.mu.Unlock()
	if err := st.DeleteIfOwner(ctxT(t), holder, "k", g.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	r := <-firstDone
	if r.err != nil || r.g.Session != first {
		t.Fatalf("Acquire by the first in line = %+v, %v; want the grant", r.g, r.err)
	}
	select {
	case r := <-secondDone:
		t.Fatalf("Acquire by the second in line returned %+v, %v while the first holds the key", r.g, r.err)
	default:
	}
	if err := other.DeleteIfOwner(ctxT(t), first, "k", r.g.Token); err != nil {
		t.Fatalf("DeleteIfOwner by the first: %v", err)
	}
	if r := <-secondDone; r.err != nil || r.g.Session != second || r.g.Token <= g.Token {
		t.Fatalf("Acquire by the second in line = %+v, %v; want a later grant", r.g, r.err)
	}
}
