package storetest

// Semaphores and read/write locks (C2 #ct2-multi).

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

func startAcquireOpts(ctx context.Context, st store.LockStore, id store.SessionID, key string, opts ...store.AcquireOption) <-chan acquireResult {
	ch := make(chan acquireResult, 1)
	go func() {
		g, err := st.Acquire(ctx, id, key, opts...)
		ch <- acquireResult{g, err}
	}()
	return ch
}

func mustTryOpts(t *testing.T, st store.LockStore, id store.SessionID, key string, opts ...store.AcquireOption) store.Grant {
	t.Helper()
	g, ok, err := st.TryInsert(ctxT(t), id, key, opts...)
	if err != nil || !ok {
		t.Fatalf("TryInsert(%q) = acquired %v, err %v; want a grant", key, ok, err)
	}
	if g.Key != key || g.Session != id || g.Token == 0 {
		t.Fatalf("TryInsert(%q) = %+v; want key %q, session %q, non-zero token", key, g, key, id)
	}
	return g
}

func mustNotTry(t *testing.T, st store.LockStore, id store.SessionID, key string, opts ...store.AcquireOption) {
	t.Helper()
	g, ok, err := st.TryInsert(ctxT(t), id, key, opts...)
	if err != nil || ok {
		t.Fatalf("TryInsert(%q) = %+v, acquired %v, err %v; want not acquired, no error", key, g, ok, err)
	}
}

// holdersAre polls until key's holders are exactly want (any order).
func holdersAre(t *testing.T, st store.LockStore, key string, want ...store.SessionID) store.LockInfo {
	t.Helper()
	var info store.LockInfo
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("holders of %q", key), func() error {
		var err error
		info, _, err = st.Inspect(ctxT(t), key)
		if err != nil {
			return err
		}
		var got []store.SessionID
		for _, h := range info.Holders {
			got = append(got, h.Session)
		}
		if !sameSet(got, want) {
			return fmt.Errorf("holders %v, want %v", got, want)
		}
		return nil
	})
	return info
}

func sameSet(a, b []store.SessionID) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// testSemaphoreLimit: 32 sessions on two instances race for a semaphore of
// 4: exactly 4 are granted, the others queue; each release admits exactly
// one more; never more than 4 hold; every grant has its own token, and
// each grant after a release a token above every earlier one.
func (s *suite) testSemaphoreLimit(t *testing.T) {
	const n, limit, key = 32, 4, "sem/limit"
	insts := s.instances(t, 2)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	grants := make(chan acquireResult, n)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	inst := map[store.SessionID]store.LockStore{}
	for i := range n {
		st := insts[i%2]
		id := openSession(t, st)
		inst[id] = st
		wg.Go(func() {
			g, err := st.Acquire(ctx, id, key, store.WithLimit(limit))
			grants <- acquireResult{g, err}
		})
	}
	holding := map[store.SessionID]store.Grant{}
	var last uint64
	tokens := map[uint64]bool{}
	// take receives one grant. The first limit grants race each other, so
	// they arrive in any order: their tokens need only be distinct. Each
	// later one is the only grant after a release: above all earlier ones.
	take := func(what string, ordered bool) {
		t.Helper()
		r := recvResult(t, grants, 20*time.Second, what)
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		if tokens[r.g.Token] || ordered && r.g.Token <= last {
			t.Fatalf("%s: token %d, want above every earlier grant's (%d) and unique", what, r.g.Token, last)
		}
		tokens[r.g.Token], last = true, max(last, r.g.Token)
		holding[r.g.Session] = r.g
		if len(holding) > limit {
			t.Fatalf("%s: %d sessions hold a semaphore of %d", what, len(holding), limit)
		}
	}
	for i := range limit {
		take(fmt.Sprintf("grant %d", i), false)
	}
	released := 0
	for released+limit < n {
		// Everyone else is queued; nobody else is granted.
		testkit.Eventually(t, 20*time.Second, "the rest queued", func() error {
			info, _, err := insts[released%2].Inspect(ctxT(t), key)
			if err != nil {
				return err
			}
			if len(info.Holders) != limit || len(info.Waiters) != n-limit-released || info.Limit != limit {
				return fmt.Errorf("%d holders, %d waiters, limit %d; want %d, %d, %d", len(info.Holders), len(info.Waiters), info.Limit, limit, n-limit-released, limit)
			}
			return nil
		})
		select {
		case r := <-grants:
			t.Fatalf("a grant beyond the limit: %+v, %v", r.g, r.err)
		default:
		}
		var g store.Grant
		for _, g = range holding {
			break
		}
		mustRelease(t, inst[g.Session], g)
		delete(holding, g.Session)
		released++
		take(fmt.Sprintf("grant after release %d", released), true)
	}
}

// testSemaphoreFIFO: a full semaphore admits its waiters in queue order,
// one per freed slot.
func (s *suite) testSemaphoreFIFO(t *testing.T) {
	const key = "sem/fifo"
	insts := s.instances(t, 1)
	st := insts[0]
	a, b := openSession(t, st), openSession(t, st)
	ga := mustTryOpts(t, st, a, key, store.WithLimit(2))
	gb := mustTryOpts(t, st, b, key, store.WithLimit(2))
	const n = 4
	ids := make([]store.SessionID, n)
	chans := make([]<-chan acquireResult, n)
	for i := range n {
		ids[i] = openSession(t, st)
		chans[i] = startAcquireOpts(ctxT(t), st, ids[i], key, store.WithLimit(2))
		waitersAre(t, st, key, ids[:i+1])
	}
	mustNotTry(t, st, openSession(t, st), key, store.WithLimit(2)) // TryInsert never jumps the queue
	free := []store.Grant{ga, gb}
	for i := range n {
		mustRelease(t, st, free[0])
		free = free[1:]
		r := recvResult(t, chans[i], 15*time.Second, fmt.Sprintf("waiter %d", i))
		if r.err != nil || r.g.Session != ids[i] {
			t.Fatalf("waiter %d: %+v, %v; want the grant for %s", i, r.g, r.err, ids[i])
		}
		for j := i + 1; j < n; j++ {
			notReturned(t, chans[j], fmt.Sprintf("waiter %d after %d", j, i))
		}
		free = append(free, r.g)
	}
}

// testLimitMismatch: requests of another kind than the key's holders and
// waiters fail with ErrLimitMismatch and write nothing.
func (s *suite) testLimitMismatch(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := openSession(t, insts[0]), openSession(t, insts[1])
	ga := mustTryOpts(t, insts[0], a, "mm/sem", store.WithLimit(3))
	for _, tc := range []struct {
		name string
		opts []store.AcquireOption
	}{
		{"another N", []store.AcquireOption{store.WithLimit(2)}},
		{"plain", nil},
		{"shared", []store.AcquireOption{store.WithMode(store.ModeShared)}},
		{"exclusive", []store.AcquireOption{store.WithMode(store.ModeExclusive)}},
	} {
		_, _, err := insts[1].TryInsert(ctxT(t), b, "mm/sem", tc.opts...)
		wantErr(t, "TryInsert "+tc.name+" on a semaphore of 3", err, store.ErrLimitMismatch)
		_, err = insts[1].Acquire(ctxT(t), b, "mm/sem", tc.opts...)
		wantErr(t, "Acquire "+tc.name+" on a semaphore of 3", err, store.ErrLimitMismatch)
	}
	info, _ := inspect(t, insts[1], "mm/sem")
	if len(info.Holders) != 1 || len(info.Waiters) != 0 || info.Limit != 3 {
		t.Fatalf("after refused requests: %+v; want one holder, no waiter, limit 3", info)
	}
	// A plain lock refuses every other kind, and the reverse.
	gp := mustTry(t, insts[0], a, "mm/plain")
	for _, o := range []store.AcquireOption{store.WithLimit(2), store.WithMode(store.ModeShared), store.WithMode(store.ModeExclusive)} {
		_, _, err := insts[1].TryInsert(ctxT(t), b, "mm/plain", o)
		wantErr(t, "TryInsert on a plain lock", err, store.ErrLimitMismatch)
		_, err = insts[1].Acquire(ctxT(t), b, "mm/plain", o)
		wantErr(t, "Acquire on a plain lock", err, store.ErrLimitMismatch)
	}
	gs := mustTryOpts(t, insts[0], a, "mm/rw", store.WithMode(store.ModeShared))
	_, err := insts[1].Acquire(ctxT(t), b, "mm/rw")
	wantErr(t, "plain Acquire on a read/write lock", err, store.ErrLimitMismatch)
	_, err = insts[1].Acquire(ctxT(t), b, "mm/rw", store.WithLimit(2))
	wantErr(t, "semaphore Acquire on a read/write lock", err, store.ErrLimitMismatch)
	// A waiter alone sets the kind, too.
	c := openSession(t, insts[0])
	gx := mustTryOpts(t, insts[0], c, "mm/wait", store.WithMode(store.ModeExclusive))
	ch := startAcquireOpts(ctxT(t), insts[1], b, "mm/wait", store.WithMode(store.ModeShared))
	waitersAre(t, insts[0], "mm/wait", []store.SessionID{b})
	_, _, err = insts[0].TryInsert(ctxT(t), a, "mm/wait", store.WithLimit(5))
	wantErr(t, "semaphore on a read/write key", err, store.ErrLimitMismatch)
	mustRelease(t, insts[0], gx)
	if r := recvResult(t, ch, 15*time.Second, "queued reader"); r.err != nil {
		t.Fatalf("queued reader: %v", r.err)
	}
	// Bad options are invalid input.
	_, _, err = insts[0].TryInsert(ctxT(t), a, "mm/bad", store.WithLimit(2), store.WithMode(store.ModeShared))
	wantErr(t, "shared with a limit", err, store.ErrInvalidArgument)
	_, _, err = insts[0].TryInsert(ctxT(t), a, "mm/bad", store.WithLimit(store.MaxLimit+1))
	wantErr(t, "limit above MaxLimit", err, store.ErrInvalidArgument)
	// Free again, a key takes any kind.
	mustRelease(t, insts[0], ga)
	mustRelease(t, insts[0], gp)
	mustRelease(t, insts[0], gs)
	mustTryOpts(t, insts[1], b, "mm/sem", store.WithMode(store.ModeShared))
	mustTryOpts(t, insts[1], b, "mm/plain", store.WithLimit(7))
}

// testSharedReaders: shared holders hold together; an exclusive request
// waits for all of them and then holds alone.
func (s *suite) testSharedReaders(t *testing.T) {
	const key = "rw/readers"
	insts := s.instances(t, 2)
	shared := store.WithMode(store.ModeShared)
	var readers []store.SessionID
	var gs []store.Grant
	for i := range 4 {
		id := openSession(t, insts[i%2])
		readers = append(readers, id)
		gs = append(gs, mustTryOpts(t, insts[i%2], id, key, shared))
	}
	info := holdersAre(t, insts[0], key, readers...)
	if !info.RW || info.Limit != 1 || info.Token != info.Holders[0].Token || info.Session != info.Holders[0].Session {
		t.Fatalf("Inspect = %+v; want a read/write key whose single-holder fields are its first holder", info)
	}
	for _, h := range info.Holders {
		if h.Mode != store.ModeShared {
			t.Fatalf("holder %+v: mode %v, want shared", h, h.Mode)
		}
	}
	w := openSession(t, insts[1])
	mustNotTry(t, insts[1], w, key, store.WithMode(store.ModeExclusive))
	ch := startAcquireOpts(ctxT(t), insts[1], w, key, store.WithMode(store.ModeExclusive))
	waitersAre(t, insts[0], key, []store.SessionID{w})
	for i, g := range gs {
		notReturned(t, ch, fmt.Sprintf("writer while %d readers hold", len(gs)-i))
		mustRelease(t, insts[i%2], g)
	}
	r := recvResult(t, ch, 15*time.Second, "writer")
	if r.err != nil {
		t.Fatalf("writer: %v", r.err)
	}
	for _, g := range gs {
		if r.g.Token <= g.Token {
			t.Fatalf("writer token %d, want above every earlier reader's (%d)", r.g.Token, g.Token)
		}
	}
	holdersAre(t, insts[0], key, w)
	mustNotTry(t, insts[0], readers[0], key, shared)
}

// testWriterPreference: a waiting exclusive request blocks later shared
// ones, even though they are compatible with the readers holding; the
// queue is served in order, so a reader queued before a second writer goes
// before it (writers do not starve readers either).
func (s *suite) testWriterPreference(t *testing.T) {
	const key = "rw/pref"
	insts := s.instances(t, 2)
	shared, excl := store.WithMode(store.ModeShared), store.WithMode(store.ModeExclusive)
	r1, r2 := openSession(t, insts[0]), openSession(t, insts[1])
	g1, g2 := mustTryOpts(t, insts[0], r1, key, shared), mustTryOpts(t, insts[1], r2, key, shared)
	w, r3, w2 := openSession(t, insts[1]), openSession(t, insts[0]), openSession(t, insts[1])
	wch := startAcquireOpts(ctxT(t), insts[1], w, key, excl)
	waitersAre(t, insts[0], key, []store.SessionID{w})
	mustNotTry(t, insts[0], r3, key, shared) // compatible with the readers, but a writer waits
	rch := startAcquireOpts(ctxT(t), insts[0], r3, key, shared)
	waitersAre(t, insts[1], key, []store.SessionID{w, r3})
	w2ch := startAcquireOpts(ctxT(t), insts[1], w2, key, excl)
	waitersAre(t, insts[0], key, []store.SessionID{w, r3, w2})
	notReturned(t, rch, "reader behind a waiting writer")
	mustRelease(t, insts[0], g1)
	notReturned(t, wch, "writer while a reader holds")
	mustRelease(t, insts[1], g2)
	rw := recvResult(t, wch, 15*time.Second, "writer")
	if rw.err != nil {
		t.Fatalf("writer: %v", rw.err)
	}
	notReturned(t, rch, "reader while the writer holds")
	mustRelease(t, insts[1], rw.g)
	rr := recvResult(t, rch, 15*time.Second, "reader after the writer")
	if rr.err != nil {
		t.Fatalf("reader: %v", rr.err)
	}
	waitersAre(t, insts[0], key, []store.SessionID{w2})
	notReturned(t, w2ch, "second writer while the reader queued before it holds")
	mustRelease(t, insts[0], rr.g)
	rw2 := recvResult(t, w2ch, 15*time.Second, "second writer after the reader")
	if rw2.err != nil {
		t.Fatalf("second writer: %v", rw2.err)
	}
	if !(g1.Token < rw.g.Token && g2.Token < rw.g.Token && rw.g.Token < rr.g.Token && rr.g.Token < rw2.g.Token) {
		t.Fatalf("tokens: readers %d, %d, writer %d, later reader %d, second writer %d; want them increasing in grant order",
			g1.Token, g2.Token, rw.g.Token, rr.g.Token, rw2.g.Token)
	}
}

// testTokensAcrossModes: the tokens of one key increase strictly over
// every grant, whatever its kind and mode.
func (s *suite) testTokensAcrossModes(t *testing.T) {
	const key = "tok/modes"
	insts := s.instances(t, 2)
	a, b := openSession(t, insts[0]), openSession(t, insts[1])
	var last uint64
	next := func(g store.Grant) {
		t.Helper()
		if g.Token <= last {
			t.Fatalf("grant %+v: token %d, want above %d", g, g.Token, last)
		}
		last = g.Token
	}
	for round := range 2 {
		ga := mustTryOpts(t, insts[0], a, key, store.WithMode(store.ModeShared))
		next(ga)
		gb := mustTryOpts(t, insts[1], b, key, store.WithMode(store.ModeShared))
		next(gb)
		mustRelease(t, insts[0], ga)
		mustRelease(t, insts[1], gb)
		gx := mustTryOpts(t, insts[1], b, key, store.WithMode(store.ModeExclusive))
		next(gx)
		mustRelease(t, insts[1], gx)
		s1 := mustTryOpts(t, insts[0], a, key, store.WithLimit(3))
		next(s1)
		s2 := mustTryOpts(t, insts[1], b, key, store.WithLimit(3))
		next(s2)
		mustRelease(t, insts[1], s2)
		mustRelease(t, insts[0], s1)
		gp := mustTry(t, insts[round%2], []store.SessionID{a, b}[round%2], key)
		next(gp)
		mustRelease(t, insts[round%2], gp)
	}
}

// testSlotRelease: a release frees only that holder's slot; a stale or
// foreign token is ErrNotOwner; LocksOf lists slots; Revoke takes them all.
func (s *suite) testSlotRelease(t *testing.T) {
	const key = "slot/rel"
	insts := s.instances(t, 1)
	st := insts[0]
	a, b := openSession(t, st), openSession(t, st)
	ga := mustTryOpts(t, st, a, key, store.WithLimit(2))
	gb := mustTryOpts(t, st, b, key, store.WithLimit(2))
	again := mustTryOpts(t, st, a, key, store.WithLimit(2))
	if again.Token != ga.Token {
		t.Fatalf("holder asking again: token %d, want its grant's %d", again.Token, ga.Token)
	}
	wantErr(t, "release of another holder's slot", st.DeleteIfOwner(ctxT(t), a, key, gb.Token), store.ErrNotOwner)
	wantErr(t, "release with a wrong token", st.DeleteIfOwner(ctxT(t), b, key, gb.Token+1), store.ErrNotOwner)
	locks, err := st.LocksOf(ctxT(t), a)
	if err != nil || len(locks) != 1 || locks[0].Key != key || locks[0].Token != ga.Token {
		t.Fatalf("LocksOf = %+v, %v; want the slot %d", locks, err, ga.Token)
	}
	if err := st.SetValue(ctxT(t), b, key, gb.Token, []byte("v-b")); err != nil {
		t.Fatalf("SetValue of a slot: %v", err)
	}
	info := holdersAre(t, st, key, a, b)
	for _, h := range info.Holders {
		if want := map[store.SessionID]string{b: "v-b"}[h.Session]; string(h.Value) != want {
			t.Fatalf("holder %s: value %q, want %q", h.Session, h.Value, want)
		}
	}
	mustRelease(t, st, ga)
	holdersAre(t, st, key, b)
	wantErr(t, "second release", st.DeleteIfOwner(ctxT(t), a, key, ga.Token), store.ErrNotOwner)
	c := openSession(t, st)
	gc := mustTryOpts(t, st, c, key, store.WithLimit(2))
	l, err := st.List(ctxT(t), "slot/", "", 0)
	if err != nil || len(l) != 1 || len(l[0].Holders) != 2 {
		t.Fatalf("List = %+v, %v; want the key with two holders", l, err)
	}
	rg, found, err := st.Revoke(ctxT(t), key)
	if err != nil || !found || rg.Token != gb.Token {
		t.Fatalf("Revoke = %+v, %v, %v; want the first holder's grant (%d)", rg, found, err, gb.Token)
	}
	if info, found := inspect(t, st, key); found {
		t.Fatalf("after Revoke: %+v; want no holder", info)
	}
	wantErr(t, "release of a revoked slot", st.DeleteIfOwner(ctxT(t), c, key, gc.Token), store.ErrNotOwner)
	n, err := st.CloseSession(ctxT(t), a)
	if err != nil || n != 0 {
		t.Fatalf("CloseSession = %d, %v; want 0 (its slot was released)", n, err)
	}
	d := openSession(t, st)
	mustTryOpts(t, st, d, "slot/close1", store.WithMode(store.ModeShared))
	mustTryOpts(t, st, d, "slot/close2", store.WithLimit(4))
	if n, err := st.CloseSession(ctxT(t), d); err != nil || n != 2 {
		t.Fatalf("CloseSession = %d, %v; want 2 slots released", n, err)
	}
}
