package etcdstore

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// heldGate holds a Store's held-set index: while closed, its watch applies
// nothing (beforeApply blocks) once armed.
type heldGate struct {
	armed   atomic.Bool
	entered chan struct{} // closed when the watch first blocked
	once    sync.Once
	release chan struct{}
	relOnce sync.Once
}

func newHeldGate() *heldGate {
	return &heldGate{entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *heldGate) hook() {
	if !g.armed.Load() {
		return
	}
	g.once.Do(func() { close(g.entered) })
	<-g.release
}

func (g *heldGate) open() { g.relOnce.Do(func() { close(g.release) }) }

// grantKeys lists "key@token" of grants, for comparisons.
func grantKeys(gs []store.Grant) []string {
	out := []string{}
	for _, g := range gs {
		out = append(out, fmt.Sprintf("%s@%d", g.Key, g.Token))
	}
	return out
}

// TestLocksOfRoundsBatched: concurrent LocksOf calls share one round (one
// read), and each gets its own session's grants — including a grant and a
// slot made through another Store, without a grant released or revoked
// through the other Store, ErrSessionDead for a session closed through it
// and for a revoked lease. A round takes only calls queued when it starts.
func TestLocksOfRoundsBatched(t *testing.T) {
	t.Parallel()
	prefix := etcdtest.Prefix(t)
	st := newStore(t, etcdtest.NewClient(t), prefix, nil)
	other := newStore(t, etcdtest.NewClient(t), prefix, nil)
	var mu sync.Mutex
	var rounds []int
	firstHeld, releaseFirst := make(chan struct{}), make(chan struct{})
	st.held.onRound = func(n int) {
		mu.Lock()
		rounds = append(rounds, n)
		first := len(rounds) == 1
		mu.Unlock()
		if first {
			close(firstHeld)
			<-releaseFirst
		}
	}
	const ttl = 5 * time.Second
	a, b, c, bystander := openSession(t, st, ttl), openSession(t, st, ttl), openSession(t, st, ttl), openSession(t, st, ttl)
	closed, revoked := openSession(t, st, ttl), openSession(t, st, ttl)
	a1, a2 := mustTry(t, st, a, "hb/a1"), mustTry(t, other, a, "hb/a2") // a2 through the other Store
	gone := mustTry(t, st, a, "hb/a-released-elsewhere")
	if err := other.DeleteIfOwner(ctxT(t), a, gone.Key, gone.Token); err != nil {
		t.Fatalf("DeleteIfOwner through the other Store: %v", err)
	}
	mustTry(t, st, a, "hb/a-revoked-elsewhere")
	if _, found, err := other.Revoke(ctxT(t), "hb/a-revoked-elsewhere"); err != nil || !found {
		t.Fatalf("Revoke through the other Store = %v, %v", found, err)
	}
	slot, ok, err := other.TryInsert(ctxT(t), c, "hb/c-sem", store.WithLimit(2))
	if err != nil || !ok {
		t.Fatalf("TryInsert slot through the other Store = %v, %v", ok, err)
	}
	mustTry(t, st, bystander, "hb/bystander")
	mustTry(t, st, closed, "hb/closed")
	if _, err := other.CloseSession(ctxT(t), closed); err != nil {
		t.Fatalf("CloseSession through the other Store: %v", err)
	}
	mustTry(t, st, revoked, "hb/revoked")
	revokeLease(t, st.cli, st, revoked)
	want := map[store.SessionID][]string{
		a: grantKeys([]store.Grant{a1, a2}),
		b: {},
		c: grantKeys([]store.Grant{slot}),
	}

	asked := []store.SessionID{c, a, b, closed, revoked, a} // a twice in one round
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
			g, err := st.LocksOf(ctxT(t), asked[i])
			results[i] = res{g, err}
		}()
	}
	call(0)
	<-firstHeld
	for i := 1; i < len(asked); i++ {
		call(i)
	}
	testkit.Eventually(t, 30*time.Second, "the other LocksOf calls queued", func() error {
		st.held.mu.Lock()
		defer st.held.mu.Unlock()
		if n := len(st.held.pending); n != len(asked)-1 {
			return fmt.Errorf("%d queued", n)
		}
		return nil
	})
	close(releaseFirst)
	wg.Wait()

	mu.Lock()
	if !slices.Equal(rounds, []int{1, len(asked) - 1}) {
		t.Errorf("LocksOf rounds %v, want [1 %d]", rounds, len(asked)-1)
	}
	mu.Unlock()
	for i, r := range results {
		id := asked[i]
		w, live := want[id]
		if !live {
			if !errors.Is(r.err, store.ErrSessionDead) {
				t.Errorf("LocksOf(%s, ended elsewhere) = %v, %v; want ErrSessionDead", id, r.g, r.err)
			}
			continue
		}
		if r.err != nil || !slices.Equal(grantKeys(r.g), w) {
			t.Errorf("LocksOf(%s) = %v, %v; want %v", id, grantKeys(r.g), r.err, w)
		}
	}
}

// TestLocksOfAfterRevokeElsewhere: a grant revoked through another Store
// before LocksOf is called is never listed, even while this Store's index
// has not seen the revoke: the round waits for the index to reach its
// read's revision, and reads directly when it cannot (the watch held past
// heldWait). The control answers from the index without waiting and must
// list the revoked grant — otherwise this test could not see a stale index.
func TestLocksOfAfterRevokeElsewhere(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		noBarrier bool
	}{{"barrier", false}, {"control-no-barrier", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			prefix := etcdtest.Prefix(t)
			st := newStore(t, etcdtest.NewClient(t), prefix, nil)
			other := newStore(t, etcdtest.NewClient(t), prefix, nil)
			gate := newHeldGate()
			st.held.beforeApply = gate.hook
			var rounds, directs atomic.Int32
			st.held.onRound = func(int) { rounds.Add(1) }
			st.held.onDirect = func() { directs.Add(1) }
			st.held.wait.Store(int64(time.Second)) // part 1 waits for it
			t.Cleanup(gate.open)

			id := openSession(t, st, 10*time.Second)
			keep := mustTry(t, st, id, "rv/keep")
			g1 := mustTry(t, st, id, "rv/one")
			g2 := mustTry(t, st, id, "rv/two")
			all := grantKeys([]store.Grant{keep, g1, g2})
			testkit.Eventually(t, 30*time.Second, "the index lists the three grants", func() error {
				got, err := st.LocksOf(ctxT(t), id)
				if err != nil || !slices.Equal(grantKeys(got), all) {
					return fmt.Errorf("LocksOf = %v, %v; want %v", grantKeys(got), err, all)
				}
				return nil
			})

			// 1. The watch held for good: the revoke of rv/one never
			// reaches the index.
			gate.armed.Store(true)
			st.held.noBarrier.Store(tc.noBarrier) // only now: a stale index could even miss the session
			if _, found, err := other.Revoke(ctxT(t), g1.Key); err != nil || !found {
				t.Fatalf("Revoke(%s) through the other Store = %v, %v", g1.Key, found, err)
			}
			<-gate.entered // the revoke's events are held
			got, err := st.LocksOf(ctxT(t), id)
			if tc.noBarrier {
				if err != nil || !slices.Contains(grantKeys(got), grantKeys([]store.Grant{g1})[0]) {
					t.Fatalf("control: LocksOf = %v, %v; want the stale index (listing the revoked %s): the test cannot see a stale answer",
						grantKeys(got), err, g1.Key)
				}
				return
			}
			if wantKeys := grantKeys([]store.Grant{keep, g2}); err != nil || !slices.Equal(grantKeys(got), wantKeys) {
				t.Fatalf("LocksOf with the index behind = %v, %v; want %v (never the revoked %s)", grantKeys(got), err, wantKeys, g1.Key)
			}
			if n := directs.Load(); n != 1 {
				t.Fatalf("%d rounds read directly, want 1 (the index could not be shown current)", n)
			}
			st.held.wait.Store(int64(time.Minute)) // part 2 must not fall back

			// 2. The watch resumes while a round waits: the answer comes
			// from the index, after the revoke.
			if _, found, err := other.Revoke(ctxT(t), g2.Key); err != nil || !found {
				t.Fatalf("Revoke(%s) through the other Store = %v, %v", g2.Key, found, err)
			}
			before := rounds.Load()
			type res struct {
				g   []store.Grant
				err error
			}
			done := make(chan res, 1)
			go func() {
				g, err := st.LocksOf(ctxT(t), id)
				done <- res{g, err}
			}()
			testkit.Eventually(t, 30*time.Second, "the round started", func() error {
				if rounds.Load() == before {
					return errors.New("no round yet")
				}
				return nil
			})
			gate.open()
			r := <-done
			if wantKeys := grantKeys([]store.Grant{keep}); r.err != nil || !slices.Equal(grantKeys(r.g), wantKeys) {
				t.Fatalf("LocksOf after the watch resumed = %v, %v; want %v", grantKeys(r.g), r.err, wantKeys)
			}
			if n := directs.Load(); n != 1 {
				t.Fatalf("%d rounds read directly, want still 1: the round should have waited for the index", n)
			}
		})
	}
}
