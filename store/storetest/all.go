package storetest

// Several locks at once: AcquireAll (C2 #ct2-acquire-all, issue 26 §2).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/store"
)

type allResult struct {
	gs  []store.Grant
	ok  bool
	err error
}

// startAcquireAll runs AcquireAll in a goroutine owned by the test.
func startAcquireAll(ctx context.Context, st store.LockStore, id store.SessionID, keys ...string) <-chan allResult {
	ch := make(chan allResult, 1)
	go func() {
		gs, ok, err := st.AcquireAll(ctx, id, keys, true)
		ch <- allResult{gs, ok, err}
	}()
	return ch
}

func recvAll(t *testing.T, ch <-chan allResult, within time.Duration, what string) allResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(within):
		t.Fatalf("%s: AcquireAll did not return within %v", what, within)
		return allResult{}
	}
}

// mustHoldAll checks that r granted keys, in that order, to id, and that
// the store shows each key held by id with that token.
func mustHoldAll(t *testing.T, st store.LockStore, id store.SessionID, r allResult, keys ...string) {
	t.Helper()
	if r.err != nil || !r.ok || len(r.gs) != len(keys) {
		t.Fatalf("AcquireAll(%q) = %d grants, acquired %v, err %v; want %d grants", keys, len(r.gs), r.ok, r.err, len(keys))
	}
	for i, g := range r.gs {
		if g.Key != keys[i] || g.Session != id || g.Token == 0 {
			t.Fatalf("AcquireAll grant %d = %+v; want key %q of session %q with a token", i, g, keys[i], id)
		}
		info, found := inspect(t, st, g.Key)
		if !found || info.Session != id || info.Token != g.Token {
			t.Fatalf("Inspect(%q) after AcquireAll = %+v (found %v); want session %q, token %d", g.Key, info, found, id, g.Token)
		}
	}
}

// holdsNothing checks that the session holds no lock.
func holdsNothing(t *testing.T, st store.LockStore, id store.SessionID, what string) {
	t.Helper()
	gs, err := st.LocksOf(ctxT(t), id)
	if err != nil {
		t.Fatalf("%s: LocksOf: %v", what, err)
	}
	if len(gs) != 0 {
		t.Fatalf("%s: the session holds %+v; want nothing", what, gs)
	}
}

func releaseAll(t *testing.T, st store.LockStore, gs []store.Grant) {
	t.Helper()
	for _, g := range gs {
		mustRelease(t, st, g)
	}
}

// testAcquireAllBasics: every key granted, in the order asked, each with
// its own token; a retried call returns the same grants; a try of a set
// with one key held answers not acquired and leaves nothing.
func (s *suite) testAcquireAllBasics(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := openSession(t, insts[0]), openSession(t, insts[1])
	keys := []string{"ab/2", "ab/1", "ab/3"}
	r := recvAll(t, startAcquireAll(ctxT(t), insts[0], a, keys...), 10*time.Second, "free keys")
	mustHoldAll(t, insts[1], a, r, keys...)
	again := recvAll(t, startAcquireAll(ctxT(t), insts[1], a, keys...), 10*time.Second, "retried call")
	for i := range keys {
		if again.err != nil || again.gs[i].Token != r.gs[i].Token {
			t.Fatalf("retried AcquireAll = %+v, %v; want the same grants %+v", again.gs, again.err, r.gs)
		}
	}
	// b tries a set that overlaps in one key: nothing is taken.
	gs, ok, err := insts[1].AcquireAll(ctxT(t), b, []string{"ab/0", "ab/3", "ab/4"}, false)
	if err != nil || ok || gs != nil {
		t.Fatalf("try of a set with a held key = %+v, %v, %v; want not acquired", gs, ok, err)
	}
	holdsNothing(t, insts[1], b, "after the refused try")
	for _, k := range []string{"ab/0", "ab/4"} {
		if info, found := inspect(t, insts[0], k); found {
			t.Fatalf("Inspect(%q) after the refused try = %+v; want free", k, info)
		}
	}
	releaseAll(t, insts[0], r.gs)
	gs, ok, err = insts[1].AcquireAll(ctxT(t), b, []string{"ab/0", "ab/3", "ab/4"}, false)
	mustHoldAll(t, insts[0], b, allResult{gs, ok, err}, "ab/0", "ab/3", "ab/4")
}

// testAcquireAllFIFO: an AcquireAll waits in each key's queue like Acquire:
// a plain waiter queued behind it is served after it.
func (s *suite) testAcquireAllFIFO(t *testing.T) {
	insts := s.instances(t, 2)
	h, w1, w2 := openSession(t, insts[0]), openSession(t, insts[1]), openSession(t, insts[0])
	hg := mustTry(t, insts[0], h, "af/1")
	ch1 := startAcquireAll(ctxT(t), insts[1], w1, "af/2", "af/1")
	waitersAre(t, insts[0], "af/1", []store.SessionID{w1})
	ch2 := startAcquire(t, ctxT(t), insts[0], w2, "af/1")
	waitersAre(t, insts[0], "af/1", []store.SessionID{w1, w2})
	// The keys are taken in ascending order: waiting for af/1, w1 holds
	// nothing yet (af/2 comes after it).
	if info, found := inspect(t, insts[0], "af/2"); found {
		t.Fatalf("af/2 while w1 waits for af/1: %+v; want free", info)
	}
	mustRelease(t, insts[0], hg)
	r1 := recvAll(t, ch1, 10*time.Second, "first in line")
	mustHoldAll(t, insts[0], w1, r1, "af/2", "af/1")
	notReturned(t, ch2, "second in line")
	releaseAll(t, insts[1], r1.gs)
	if r2 := recvResult(t, ch2, 10*time.Second, "second in line"); r2.err != nil || r2.g.Session != w2 {
		t.Fatalf("second in line: %+v, %v; want the grant", r2.g, r2.err)
	}
}

// testAcquireAllOppositeOrders: two sessions ask for the same keys in
// opposite orders, again and again, on two instances: every call is
// granted (no deadlock) and they never hold a key together.
func (s *suite) testAcquireAllOppositeOrders(t *testing.T) {
	const rounds = 10
	insts := s.instances(t, 2)
	orders := [][]string{{"ao/x", "ao/y", "ao/z"}, {"ao/z", "ao/y", "ao/x"}}
	ctx := ctxT(t)
	var (
		mu      sync.Mutex
		holding int
		wg      sync.WaitGroup
	)
	errs := make(chan error, 2)
	for i, keys := range orders {
		st := insts[i]
		id := openSession(t, st)
		wg.Go(func() {
			for range rounds {
				gs, ok, err := st.AcquireAll(ctx, id, keys, true)
				if err != nil || !ok {
					errs <- fmt.Errorf("AcquireAll(%q) = %v, %v", keys, ok, err)
					return
				}
				mu.Lock()
				holding++
				both := holding > 1
				mu.Unlock()
				if both {
					errs <- fmt.Errorf("two sessions hold %q at once", keys)
					return
				}
				mu.Lock()
				holding--
				mu.Unlock()
				for _, g := range gs {
					if err := st.DeleteIfOwner(ctx, id, g.Key, g.Token); err != nil {
						errs <- err
						return
					}
				}
			}
			errs <- nil
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("two AcquireAll callers with opposite orders did not finish within 30s: deadlock")
	}
	for range orders {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// testAcquireAllLeavesNothing: a cancelled wait, a refused try and a kind
// mismatch leave neither a grant nor a queue place; keys held before the
// call stay held.
func (s *suite) testAcquireAllLeavesNothing(t *testing.T) {
	insts := s.instances(t, 2)
	h, a := openSession(t, insts[0]), openSession(t, insts[1])
	pre := mustTry(t, insts[1], a, "al/0") // held before: never released by a failed call
	hg := mustTry(t, insts[0], h, "al/2")
	ctx, cancel := context.WithCancel(ctxT(t))
	ch := startAcquireAll(ctx, insts[1], a, "al/3", "al/2", "al/1", "al/0")
	waitersAre(t, insts[0], "al/2", []store.SessionID{a})
	if info, found := inspect(t, insts[0], "al/1"); !found || info.Session != a {
		t.Fatalf("al/1 while a waits for al/2: %+v (found %v); want held by a (ascending order)", info, found)
	}
	cancel()
	r := recvAll(t, ch, 10*time.Second, "cancelled")
	wantErr(t, "cancelled AcquireAll", r.err, context.Canceled)
	if r.gs != nil || r.ok {
		t.Fatalf("cancelled AcquireAll returned grants %+v, %v", r.gs, r.ok)
	}
	waitersAre(t, insts[0], "al/2", nil)
	for _, k := range []string{"al/1", "al/3"} {
		if info, found := inspect(t, insts[0], k); found {
			t.Fatalf("Inspect(%q) after the cancelled AcquireAll = %+v; want free", k, info)
		}
	}
	if info, found := inspect(t, insts[0], "al/0"); !found || info.Token != pre.Token {
		t.Fatalf("al/0, held before the call: %+v (found %v); want still held with token %d", info, found, pre.Token)
	}
	// A try stops at the held key and gives back what it took.
	if gs, ok, err := insts[1].AcquireAll(ctxT(t), a, []string{"al/1", "al/2"}, false); err != nil || ok || gs != nil {
		t.Fatalf("try with al/2 held = %+v, %v, %v; want not acquired", gs, ok, err)
	}
	if info, found := inspect(t, insts[0], "al/1"); found {
		t.Fatalf("al/1 after the refused try = %+v; want free", info)
	}
	// A semaphore key among plain ones: ErrLimitMismatch, nothing kept.
	sem := openSession(t, insts[0])
	if _, ok, err := insts[0].TryInsert(ctxT(t), sem, "al/s", store.WithLimit(2)); err != nil || !ok {
		t.Fatalf("semaphore slot: %v, %v", ok, err)
	}
	_, _, err := insts[1].AcquireAll(ctxT(t), a, []string{"al/1", "al/s"}, true)
	wantErr(t, "AcquireAll with a semaphore key", err, store.ErrLimitMismatch)
	if info, found := inspect(t, insts[0], "al/1"); found {
		t.Fatalf("al/1 after the mismatch = %+v; want free", info)
	}
	gs, err := insts[1].LocksOf(ctxT(t), a)
	if err != nil || len(gs) != 1 || gs[0].Key != "al/0" {
		t.Fatalf("LocksOf(a) at the end = %+v, %v; want only al/0", gs, err)
	}
	mustRelease(t, insts[0], hg)
}

// testAcquireAllSessionDeath: a session that dies while its AcquireAll
// waits ends the call with ErrSessionDead, and the keys it took are freed.
//
// The session dies when the test says so (Config.Expire, out of band), so
// it has LongTTL: with TTL (2 s) it could die on its own first — on
// PostgreSQL the suite does not heartbeat, on etcd a keepalive can be late
// on a loaded machine — and then it never queued behind ad/2 ("waiters of
// "ad/2": not true after 10s: waiters [], want [a]", etcd beside two CPU
// burners, issue 21). The bound after Expire does not depend on the TTL.
func (s *suite) testAcquireAllSessionDeath(t *testing.T) {
	insts := s.instances(t, 2)
	h := openSession(t, insts[0])
	a := openSession(t, insts[1])
	hg := mustTry(t, insts[0], h, "ad/2")
	ch := startAcquireAll(ctxT(t), insts[1], a, "ad/1", "ad/2")
	waitersAre(t, insts[0], "ad/2", []store.SessionID{a})
	s.cfg.Expire(t, insts[1], a)
	r := recvAll(t, ch, s.expiryBound(), "waiter whose session expired")
	wantErr(t, "AcquireAll of an expired session", r.err, store.ErrSessionDead)
	waitersAre(t, insts[0], "ad/2", nil)
	if info, found := inspect(t, insts[0], "ad/1"); found {
		t.Fatalf("ad/1 after its holder's session expired = %+v; want free", info)
	}
	mustRelease(t, insts[0], hg)
}

// testAcquireAllLimits: bad key sets are ErrInvalidArgument and an unknown
// session ErrSessionDead; neither writes anything.
func (s *suite) testAcquireAllLimits(t *testing.T) {
	insts := s.instances(t, 1)
	st := insts[0]
	a := openSession(t, st)
	many := make([]string, store.MaxAcquireKeys+1)
	for i := range many {
		many[i] = fmt.Sprintf("am/%03d", i)
	}
	for _, tc := range []struct {
		what string
		keys []string
	}{
		{"no key", nil},
		{"an empty key", []string{"am/1", ""}},
		{"a key twice", []string{"am/1", "am/2", "am/1"}},
		{"a NUL byte", []string{"am/1", "am/\x00"}},
		{"a key too long", []string{strings.Repeat("k", store.MaxKeyLen+1)}},
		{fmt.Sprintf("%d keys", len(many)), many},
	} {
		_, _, err := st.AcquireAll(ctxT(t), a, tc.keys, true)
		wantErr(t, "AcquireAll with "+tc.what, err, store.ErrInvalidArgument)
	}
	holdsNothing(t, st, a, "after refused calls")
	if info, found := inspect(t, st, "am/1"); found {
		t.Fatalf("am/1 after refused calls = %+v; want free", info)
	}
	// The most keys allowed are granted.
	gs, ok, err := st.AcquireAll(ctxT(t), a, many[:store.MaxAcquireKeys], false)
	if err != nil || !ok || len(gs) != store.MaxAcquireKeys {
		t.Fatalf("AcquireAll of %d keys = %d grants, %v, %v", store.MaxAcquireKeys, len(gs), ok, err)
	}
	_, _, err = st.AcquireAll(ctxT(t), store.NewSessionID(), []string{"am/x", "am/y"}, true)
	wantErr(t, "AcquireAll of an unknown session", err, store.ErrSessionDead)
	if info, found := inspect(t, st, "am/x"); found {
		t.Fatalf("am/x after an unknown session's call = %+v; want free", info)
	}
}

// testAcquireAllRace: 32 sessions on two instances each take random
// overlapping sets of a few keys out of six, in random order, twice: every
// call is granted (no deadlock), each caller holds its whole set while no
// other caller holds any key of it, and every key's tokens increase.
func (s *suite) testAcquireAllRace(t *testing.T) {
	const n, rounds, nkeys = 32, 2, 6
	insts := s.instances(t, 2)
	ids := make([]store.SessionID, n)
	for i := range ids {
		ids[i] = openSession(t, insts[i%2])
	}
	pool := make([]string, nkeys)
	for i := range pool {
		pool[i] = fmt.Sprintf("ar/%d", i)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var (
		mu         sync.Mutex
		holder     = map[string]store.SessionID{}
		lastToken  = map[string]uint64{}
		violations []string
		wg         sync.WaitGroup
	)
	start := make(chan struct{})
	errs := make(chan error, n)
	for i := range n {
		st, id := insts[i%2], ids[i]
		rng := rand.New(rand.NewPCG(uint64(i), 26))
		wg.Go(func() {
			<-start
			for range rounds {
				keys := slices.Clone(pool)
				rng.Shuffle(len(keys), func(a, b int) { keys[a], keys[b] = keys[b], keys[a] })
				keys = keys[:2+rng.IntN(2)]
				gs, ok, err := st.AcquireAll(ctx, id, keys, true)
				if err != nil || !ok {
					errs <- fmt.Errorf("AcquireAll(%q) = %v, %v", keys, ok, err)
					return
				}
				mu.Lock()
				for _, g := range gs {
					if other, busy := holder[g.Key]; busy {
						violations = append(violations, fmt.Sprintf("%s granted %q while %s holds it", id, g.Key, other))
					}
					if g.Token <= lastToken[g.Key] {
						violations = append(violations, fmt.Sprintf("%q token %d after %d", g.Key, g.Token, lastToken[g.Key]))
					}
					holder[g.Key], lastToken[g.Key] = id, g.Token
				}
				mu.Unlock()
				mu.Lock() // unmarked before released: a later grant is never a false overlap
				for _, g := range gs {
					delete(holder, g.Key)
				}
				mu.Unlock()
				for _, g := range gs {
					if err := st.DeleteIfOwner(ctx, id, g.Key, g.Token); err != nil {
						errs <- fmt.Errorf("release %q: %w", g.Key, err)
						return
					}
				}
			}
			errs <- nil
		})
	}
	close(start)
	deadline := time.After(45 * time.Second)
	for range n {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("32 AcquireAll callers did not all finish within 45s: deadlock or a lost wake-up")
		}
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("%d violations, first: %s", len(violations), violations[0])
	}
}
