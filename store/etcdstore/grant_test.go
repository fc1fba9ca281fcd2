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

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// TestGroupCommitCallerGivesUp: a request whose caller's ctx ends before it
// is sent is dropped; a call whose ctx ends while its request is in flight
// returns only once the outcome is known and settled (C2
// #ct2-leave-after-cut): an Acquire has left the queue, and a grant it or a
// TryInsert made stays (a retry returns it) and is counted as held.
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
		settling := settlingOf(t, st, key)
		cancel()
		awaitSettling(t, key, settling, done, g3.open)
		g3.open()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire(%s) cancelled in flight: %v, want context.Canceled", key, err)
		}
		if key == "free" {
			st.mu.Lock()
			_, recorded := st.sessions[id].held["free"]
			st.mu.Unlock()
			if !recorded {
				t.Fatal("the cut Acquire(free) returned before its grant was recorded as held")
			}
			info, found, err := st.Inspect(ctxT(t), key)
			if err != nil || !found || info.Session != id {
				t.Fatalf("Inspect(free) after the abandoned Acquire = %+v, %v, %v; want granted to its session", info, found, err)
			}
			if g, err := st.Acquire(ctxT(t), id, key); err != nil || g.Token != info.Token {
				t.Fatalf("retried Acquire(free) = %+v, %v; want the same grant (token %d)", g, err, info.Token)
			}
			continue
		}
		if info, _, err := st.Inspect(ctxT(t), key); err != nil || len(info.Waiters) > 0 {
			t.Fatalf("Inspect(taken) right after the cut Acquire returned = waiters %v, %v; want none", info.Waiters, err)
		}
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
	settling := settlingOf(t, st, "orphan")
	cancel4()
	awaitSettling(t, "orphan", settling, done4, g4.open)
	g4.open()
	if err := <-done4; !errors.Is(err, context.Canceled) {
		t.Fatalf("TryInsert(orphan) cancelled in flight: %v, want context.Canceled", err)
	}
	st.mu.Lock()
	_, recorded := st.sessions[id].held["orphan"]
	st.mu.Unlock()
	if !recorded {
		t.Fatal("the cut TryInsert(orphan) returned before its grant was recorded as held")
	}
	mustTry(t, st, id, "after")
	// held/0, held/1, free, orphan, after.
	if n, err := st.CloseSession(ctxT(t), id); err != nil || n != 5 {
		t.Fatalf("CloseSession = %d, %v; want 5 grants, nil", n, err)
	}
	if got := lockKeys(t, etcdtest.NewClient(t), st.prefix); !slices.Equal(got, []string{"taken"}) {
		t.Fatalf("grant keys after CloseSession: %v, want only the other session's", got)
	}
}

// settlingOf receives when a call on st waits for a commit of key in
// flight (the group commit's settling hook), until the test ends.
func settlingOf(t *testing.T, st *Store, key string) <-chan struct{} {
	settling := make(chan struct{}, 1)
	st.batch.SetSettling(func(k string) {
		if k == key {
			select {
			case settling <- struct{}{}:
			default:
			}
		}
	})
	t.Cleanup(func() { st.batch.SetSettling(nil) })
	return settling
}

// awaitSettling waits until a call cut while its request of key is held in
// flight reports that it waits for that request's commit (settling); it
// fails the test if the call returns first.
func awaitSettling(t *testing.T, key string, settling <-chan struct{}, done <-chan error, open func()) {
	t.Helper()
	select {
	case <-settling:
	case err := <-done:
		open()
		t.Fatalf("the cut call on %s returned (%v) while its request was in flight; want it to wait for the commit", key, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("the cut call on %s neither returned nor waited for its request within 30s", key)
	}
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
