package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/testkit"
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

// setGate makes every later batch of st pass through g; g is opened when
// the test ends, before the Store is closed.
func setGate(t *testing.T, st *Store, g *gate) {
	t.Cleanup(g.open)
	hook := g.hook
	st.commitHook.Store(&hook)
}

// queued is how many requests wait in the Store's queue.
func queued(st *Store) int { return st.batch.Queued() }

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
		if err != nil || len(resp.Kvs) != 1 || st.token(resp.Kvs[0].ModRevision) != r.g.Token {
			t.Fatalf("grant key of %s = %v, %v; want one whose mod revision is token %d's", key, resp, err, r.g.Token)
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
