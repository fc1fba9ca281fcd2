package parity

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
)

// Rows of issue #15 §3–§4: counting semaphores and read/write locks
// (C2 #ct2-multi).

// multiHolders renders the holders of a semaphore or read/write key by name
// (token order, as Inspect lists them) with their mode, the limit and the
// waiters: "holders=[K A] limit=2 waiters=[C D]".
func multiHolders(info client.LockInfo, err error, names map[string]string) string {
	if err != nil {
		return "error(" + sdkErr(err) + ")"
	}
	if !info.Held {
		return "free"
	}
	label := func(id string) string {
		if n, ok := names[id]; ok {
			return n
		}
		return "other"
	}
	var hs, ws []string
	for _, h := range info.Holders {
		s := label(h.Session)
		if h.Mode != "" {
			s += ":" + h.Mode
		}
		hs = append(hs, s)
	}
	for _, w := range info.Waiters {
		ws = append(ws, label(w))
	}
	return fmt.Sprintf("holders=[%s] limit=%d waiters=[%s]", strings.Join(hs, " "), info.Limit, strings.Join(ws, " "))
}

// mismatch tries an Acquire of another kind on key (bounded: a wrongly
// queued request must not hang the row) and names its error.
func mismatch(t *testing.T, ctx context.Context, s *client.Session, key string, opts ...client.AcquireOption) string {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := s.Acquire(actx, key, opts...)
	if err == nil {
		_ = l.Release(ctx)
	}
	return sdkErr(err)
}

// semaphore: a semaphore of 2 across sessions of their own clients. Two
// holders at once (one a separate process), a third is locked out and two
// wait in FIFO order; another N, a plain and a shared request are refused
// with ErrLimitMismatch; a release hands the slot to the first waiter, and
// the SIGKILL of the other process's holder frees its slot for the second
// within TTL + slack. Every slot has its own token, increasing per grant.
func semaphore(t *testing.T, e *env) string {
	ctx := testCtx(t)
	const key = "semaphore/k"
	lim := client.WithLimit(2)
	child, line := startProc(t, "client", os.Args[0], []string{"-test.run=^$"},
		[]string{childClientEnv + "=" + e.shared.addr + " " + key + " 2"}, "HELD ")
	var (
		childToken   uint64
		childSession string
	)
	if _, err := fmt.Sscanf(line, "HELD %d %s", &childToken, &childSession); err != nil {
		t.Fatalf("client process said %q: %v", line, err)
	}
	c := newClient(t, e.shared.addr)
	names := map[string]string{childSession: "K"}
	sess := map[string]*client.Session{}
	for _, who := range []string{"A", "C", "D", "E", "F"} {
		s := newSession(t, ctx, newClient(t, e.shared.addr))
		names[s.ID()] = who
		sess[who] = s
	}
	la, err := sess["A"].Acquire(ctx, key, lim)
	if err != nil {
		t.Fatalf("A Acquire(limit 2) with one slot free: %v", err)
	}
	var out []string
	info, err := c.Inspect(ctx, key)
	out = append(out, multiHolders(info, err, names))
	_, err = sess["E"].TryAcquire(ctx, key, lim)
	out = append(out, "try(E)="+sdkErr(err))

	granted := make(chan grant, 2)
	for i, who := range []string{"C", "D"} {
		go func() { // exits when Acquire returns (granted, failed or ctx ended)
			l, err := sess[who].Acquire(ctx, key, lim)
			granted <- grant{who: who, l: l, err: err, at: time.Now()}
		}()
		waitQueued(t, ctx, c, key, i+1)
	}
	out = append(out, "mismatch(limit=3)="+mismatch(t, ctx, sess["F"], key, client.WithLimit(3)),
		"mismatch(plain)="+mismatch(t, ctx, sess["F"], key),
		"mismatch(shared)="+mismatch(t, ctx, sess["F"], key, client.Shared()))
	info, err = c.Inspect(ctx, key)
	out = append(out, multiHolders(info, err, names))

	if err := la.Release(ctx); err != nil {
		t.Fatalf("A Release: %v", err)
	}
	g := await(t, granted, 20*time.Second, "the first waiter's slot after a release")
	if g.err != nil {
		t.Fatalf("waiter %s Acquire: %v", g.who, g.err)
	}
	first := g.l
	waitQueued(t, ctx, c, key, 1)
	out = append(out, "release(A)->"+g.who)

	killedAt := time.Now()
	child.kill(t)
	g = await(t, granted, ttl+slack+10*time.Second, "the second waiter's slot after SIGKILL of a holder")
	if g.err != nil {
		t.Fatalf("waiter %s Acquire: %v", g.who, g.err)
	}
	second := g.l
	took := g.at.Sub(killedAt)
	within := took <= ttl+slack
	if !within {
		t.Errorf("waiter granted %v after the kill; want within TTL %v + %v", took, ttl, slack)
	}
	t.Logf("waiter granted %v after SIGKILL of the holder process", took.Round(time.Millisecond))
	out = append(out, fmt.Sprintf("kill(K)->%s within-ttl+slack=%v", g.who, within))
	info, err = c.Inspect(ctx, key)
	out = append(out, multiHolders(info, err, names))

	tokens := "increasing"
	if childToken == la.Token() || max(childToken, la.Token()) >= first.Token() || first.Token() >= second.Token() {
		tokens = fmt.Sprintf("K=%d,A=%d,%d,%d", childToken, la.Token(), first.Token(), second.Token())
	}
	out = append(out, "tokens="+tokens)
	for _, l := range []*client.Lock{first, second} {
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release: %v", err)
		}
	}
	info, err = c.Inspect(ctx, key)
	return strings.Join(append(out, "end="+multiHolders(info, err, names)), " ")
}

// sharedLock: a read/write lock. Two readers hold at once; a writer queues,
// and a reader arriving after it queues behind it (writer preference), as
// does a TryAcquire; plain and semaphore requests are refused; the writer
// is granted once the last reader releases, the later reader once the
// writer releases; tokens order readers < writer < later reader.
func sharedLock(t *testing.T, e *env) string {
	ctx := testCtx(t)
	const key = "rwlock/k"
	c := newClient(t, e.shared.addr)
	names := map[string]string{}
	sess := map[string]*client.Session{}
	for _, who := range []string{"R1", "R2", "W", "R3", "R4", "F"} {
		s := newSession(t, ctx, newClient(t, e.shared.addr))
		names[s.ID()] = who
		sess[who] = s
	}
	var out []string
	var readers []*client.Lock
	for _, who := range []string{"R1", "R2"} {
		l, err := sess[who].Acquire(ctx, key, client.Shared())
		if err != nil {
			t.Fatalf("%s Acquire(shared): %v", who, err)
		}
		readers = append(readers, l)
	}
	info, err := c.Inspect(ctx, key)
	out = append(out, multiHolders(info, err, names))

	granted := make(chan grant, 2)
	for i, w := range []struct {
		who  string
		mode client.AcquireOption
	}{{"W", client.Exclusive()}, {"R3", client.Shared()}} {
		go func() { // exits when Acquire returns (granted, failed or ctx ended)
			l, err := sess[w.who].Acquire(ctx, key, w.mode)
			granted <- grant{who: w.who, l: l, err: err, at: time.Now()}
		}()
		waitQueued(t, ctx, c, key, i+1)
	}
	_, err = sess["R4"].TryAcquire(ctx, key, client.Shared())
	out = append(out, "try-shared(R4)="+sdkErr(err),
		"mismatch(plain)="+mismatch(t, ctx, sess["F"], key),
		"mismatch(limit=2)="+mismatch(t, ctx, sess["F"], key, client.WithLimit(2)))
	info, err = c.Inspect(ctx, key)
	out = append(out, multiHolders(info, err, names))

	if err := readers[0].Release(ctx); err != nil {
		t.Fatalf("R1 Release: %v", err)
	}
	info, err = c.Inspect(ctx, key)
	out = append(out, "release(R1):"+multiHolders(info, err, names))
	if err := readers[1].Release(ctx); err != nil {
		t.Fatalf("R2 Release: %v", err)
	}
	g := await(t, granted, 20*time.Second, "a grant after the last reader's release")
	if g.err != nil {
		t.Fatalf("%s Acquire: %v", g.who, g.err)
	}
	writer := g.l
	info, err = c.Inspect(ctx, key)
	out = append(out, "release(R2)->"+g.who+":"+multiHolders(info, err, names))
	if err := writer.Release(ctx); err != nil {
		t.Fatalf("%s Release: %v", g.who, err)
	}
	g = await(t, granted, 20*time.Second, "a grant after the writer's release")
	if g.err != nil {
		t.Fatalf("%s Acquire: %v", g.who, g.err)
	}
	later := g.l
	out = append(out, "release(W)->"+g.who)

	tokens := "readers<writer<reader"
	rt := []uint64{readers[0].Token(), readers[1].Token()}
	if rt[0] == rt[1] || slices.Max(rt) >= writer.Token() || writer.Token() >= later.Token() {
		tokens = fmt.Sprintf("R1=%d,R2=%d,%d,%d", rt[0], rt[1], writer.Token(), later.Token())
	}
	out = append(out, "tokens="+tokens)
	if err := later.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
	info, err = c.Inspect(ctx, key)
	return strings.Join(append(out, "end="+multiHolders(info, err, names)), " ")
}
