package parity

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// scenario is one behaviour checked on every backend. run performs it,
// asserts along the way, and returns a short description of what it
// observed; TestParity compares that with the expectation.
type scenario struct {
	name string
	// want is the outcome expected on every backend.
	want string
	// override replaces want for a backend (and its TLS row, see
	// baseBackend). Only for an intended divergence listed in
	// docs/backends.md, which divergence names.
	override   map[string]string
	divergence string
	run        func(t *testing.T, e *env) string
}

func (s scenario) expect(backend string) string {
	if w, ok := s.override[baseBackend(backend)]; ok {
		return w
	}
	return s.want
}

// scenarios is the suite, in table order.
var scenarios = []scenario{
	{
		name: "acquire-release",
		want: "acquire=ok inspect=held(self) list=1 release=ok lock-err=ErrReleased inspect=free close=ok session-err=ErrClosed",
		run:  acquireRelease,
	},
	{
		name: "try-acquire-held",
		want: "try=ErrLocked inspect=held(A) wait(300ms)=ErrWaitTimeout inspect=held(A) try-after-release=ok token=greater",
		run:  tryAcquireHeld,
	},
	{
		name: "tokens-increase",
		want: "grants=6 strictly-increasing=true",
		run:  tokensIncrease,
	},
	{
		name: "fifo-3-clients",
		want: "queue=held(H) waiters=[1 2 3] grants=[1 2 3] tokens=increasing",
		run:  fifoHandOver,
	},
	{
		name: "release-retry-safety",
		want: "release=ok release-again=ok stale(A,t1)=NOT_OWNER stale(B,t1)=NOT_OWNER other-session(A,t2)=NOT_OWNER inspect=held(B) release(B)=ok",
		run:  releaseRetry,
	},
	{
		name: "revoke",
		want: "revoke=held(H) holder-done=ErrLockLost holder-session=live waiter=ok token=greater holder-release=ErrNotOwner revoke-free=free",
		run:  revoke,
	},
	{
		name: "watch-order",
		want: "events=acquired(A),released(A),acquired(B),revoked(B),acquired(C),expired(C),acquired(A:end) tokens=match",
		run:  watchOrder,
	},
	{
		name: "death-client-silence",
		want: "waiter=ok after-holder-deadline=true within-ttl+slack=true notice=dead old-release=NOT_OWNER old-heartbeat=dead",
		run:  clientSilence,
	},
	{
		name: "death-client-sigkill",
		want: "waiter=ok within-ttl+slack=true token=greater",
		run:  clientSigkill,
	},
	{
		name: "death-lockd-sigkill",
		want: "waiters-on-new-lockd=ok,ok within-ttl+slack=true holder-trust-ended-first=true holder-err=ErrSessionExpired tokens=greater",
		run:  lockdSigkill,
	},
	{
		name: "fencing-across-restart",
		want: "stop=clean token-after-restart=greater",
		run:  fencingRestart,
	},
	{
		name: "restart-semantics",
		want: "heartbeat=dead acquire=SESSION_DEAD inspect=held(old) close=released-0 after-close=held(old) waiter=ok",
		override: map[string]string{
			backendPG:   "heartbeat=live acquire=granted(same-token) inspect=held(old) close=released-1 after-close=free waiter=ok",
			backendEtcd: "heartbeat=live acquire=granted(same-token) inspect=held(old) close=released-1 after-close=free waiter=ok",
		},
		divergence: "docs/backends.md divergence 1 (restart semantics: the embedded etcd's restarted store adopts no session of an earlier epoch)",
		run:        restartSemantics,
	},
	{
		name: "holder-identity",
		want: "inspect=ok list=ok set-value=ok watch=acquired(owner):ok,value(v2):ok",
		run:  holderIdentity,
	},
	{
		name: "election",
		want: "first=none leaders=A:a1,A:a2,B:b1,C:c1 last=none proclaim-token=same tokens=increasing",
		run:  election,
	},
	{
		name: "semaphore",
		want: "holders=[K A] limit=2 waiters=[] try(E)=ErrLocked mismatch(limit=3)=ErrLimitMismatch " +
			"mismatch(plain)=ErrLimitMismatch mismatch(shared)=ErrLimitMismatch holders=[K A] limit=2 waiters=[C D] " +
			"release(A)->C kill(K)->D within-ttl+slack=true holders=[C D] limit=2 waiters=[] tokens=increasing end=free",
		run: semaphore,
	},
	{
		name: "shared-lock",
		want: "holders=[R1:shared R2:shared] limit=1 waiters=[] try-shared(R4)=ErrLocked mismatch(plain)=ErrLimitMismatch " +
			"mismatch(limit=2)=ErrLimitMismatch holders=[R1:shared R2:shared] limit=1 waiters=[W R3] " +
			"release(R1):holders=[R2:shared] limit=1 waiters=[W R3] release(R2)->W:holders=[W:exclusive] limit=1 waiters=[R3] " +
			"release(W)->R3 tokens=readers<writer<reader end=free",
		run: sharedLock,
	},
	{
		name: "lock-delay",
		want: "inspect=2s after-release=granted after-revoke=locked inspect-free=delay-left:true wait=waited-delay tokens=increasing",
		run:  lockDelayRow,
	},
	{
		name: "max-hold",
		want: "lost=max_hold watch=max_hold same-session-again=granted token-higher=true",
		run:  maxHoldRow,
	},
	{
		name: "deadlock",
		want: "refused=closing(B) keys=[a,b] other=waiting after-release=granted " +
			"opt-out:refused=older(A) keys=[a,b] other=waiting after-release=granted",
		run: deadlockRow,
	},
	{
		name: "deadlock-3",
		want: "refused=closing(S2) keys=[k0,k1,k2] others=waiting unwound=S1,S0",
		run:  deadlock3Row,
	},
	{
		name: "deadlock-knot",
		want: "refused=W keys=[s,x] holders=waiting unwound=T1,T2",
		run:  deadlockKnotRow,
	},
	{
		name: "acquire-all",
		want: "try=ErrLocked held=b=held(A) wait(300ms)=ErrWaitTimeout held=b=held(A) while-waiting=a=held(B),b=held(A) waiters=[B] " +
			"grants=3 order=asked tokens=own after-release=none opposite-orders=no-deadlock",
		run: acquireAllRow,
	},
	{
		name: "check-token",
		want: "A:lin=current A:cached=current A:index=current above-A=stale(tokens=1) " +
			"after-B:A:lin=stale(tokens=1) A:cached=stale(tokens=1) B:lin=current B:cached=current " +
			"after-revoke:B:lin=stale(tokens=0) B:cached=stale(tokens=0) " +
			"semaphore=current(tokens=2),current(tokens=2) never-held=stale(tokens=0) token0=ErrInvalidArgument",
		run: checkTokenRow,
	},
	{
		name: "bad-input-sdk",
		want: "ErrInvalidArgument: open(ttl=1s) acquire(bad-keys) try(bad-keys) inspect(bad-keys) revoke(bad-keys) " +
			"wait-timeout=-1s wait-timeout=11m0s list(limit=5000) list(token=junk) watch(prefix=NUL); " +
			"ErrClosed: acquire(closed-session)",
		run: badInputSDK,
	},
	{
		name: "bad-input-wire",
		want: "INVALID_ARGUMENT: open(ttl=1s) open(ttl=2h) acquire(session=empty) acquire(session=ctl-char) " +
			"acquire(bad-keys) acquire(try+timeout) acquire(timeout<0) release(token=0) inspect(key=empty) " +
			"list(limit=5000) list(token=junk) revoke(key=empty) watch(prefix=NUL); " +
			"error(INVALID_ARGUMENT): heartbeat(request_id=0); SESSION_DEAD: acquire(unknown-session); " +
			"NOT_OWNER: release(unknown-session); dead: heartbeat(unknown-session); released-0: close(unknown-session); " +
			"WAIT_TIMEOUT: acquire(wait=200ms,held)",
		run: badInputWire,
	},
}

// badKeys break store.ValidateKey: empty, NUL, too long, not UTF-8.
var badKeys = []string{"", "a\x00b", strings.Repeat("k", 513), "\xff"}

// badWireKeys are the badKeys a Go gRPC client can send: protobuf refuses
// to marshal a string field that is not UTF-8 (the SDK rejects such keys
// itself, see bad-input-sdk).
var badWireKeys = badKeys[:3]

func acquireRelease(t *testing.T, e *env) string {
	ctx := testCtx(t)
	c := newClient(t, e.shared.addr)
	s := newSession(t, ctx, c)
	if s.ID() == "" || s.TTL() < ttl {
		t.Errorf("session id %q ttl %v; want an id and ttl >= %v", s.ID(), s.TTL(), ttl)
	}
	names := map[string]string{s.ID(): "self"}
	const key = "acquire-release/k"
	var out []string

	l := acquire(t, ctx, s, key)
	out = append(out, "acquire=ok")
	if l.Token() == 0 || closed(l.Done()) || l.Err() != nil {
		t.Errorf("new lock: token %d done %v err %v; want a token and a trusted lock", l.Token(), closed(l.Done()), l.Err())
	}
	info, err := c.Inspect(ctx, key)
	out = append(out, "inspect="+holder(info, err, names))
	if err == nil && (info.Token != l.Token() || info.AcquiredAt.IsZero()) {
		t.Errorf("Inspect = token %d acquired %v; want token %d and a time", info.Token, info.AcquiredAt, l.Token())
	}
	locks, next, err := c.List(ctx, "acquire-release/", client.ListOptions{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	out = append(out, fmt.Sprintf("list=%d", len(locks)))
	if len(locks) != 1 || locks[0].Key != key || locks[0].Session != s.ID() || locks[0].Token != l.Token() || next != "" {
		t.Errorf("List = %+v next %q; want exactly %s held by the session", locks, next, key)
	}
	out = append(out, "release="+sdkErr(l.Release(ctx)))
	if !closed(l.Done()) {
		t.Error("Done not closed after Release")
	}
	out = append(out, "lock-err="+sdkErr(l.Err()))
	info, err = c.Inspect(ctx, key)
	out = append(out, "inspect="+holder(info, err, names))
	out = append(out, "close="+sdkErr(s.Close(ctx)))
	out = append(out, "session-err="+sdkErr(s.Err()))
	return strings.Join(out, " ")
}

func tryAcquireHeld(t *testing.T, e *env) string {
	ctx := testCtx(t)
	c1, c2 := newClient(t, e.shared.addr), newClient(t, e.shared.addr)
	a, b, c := newSession(t, ctx, c1), newSession(t, ctx, c2), newSession(t, ctx, c2)
	names := map[string]string{a.ID(): "A", b.ID(): "B", c.ID(): "C"}
	const key = "try-acquire/k"
	var out []string

	la := acquire(t, ctx, a, key)
	_, err := b.TryAcquire(ctx, key)
	out = append(out, "try="+sdkErr(err))
	info, err := c1.Inspect(ctx, key)
	out = append(out, "inspect="+holder(info, err, names))
	_, err = b.Acquire(ctx, key, client.WithWaitTimeout(300*time.Millisecond))
	out = append(out, "wait(300ms)="+sdkErr(err))
	// The timed-out waiter must have left the queue.
	info, err = c1.Inspect(ctx, key)
	out = append(out, "inspect="+holder(info, err, names))
	if err := la.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	lc, err := c.TryAcquire(ctx, key)
	out = append(out, "try-after-release="+sdkErr(err))
	if err == nil {
		out = append(out, "token="+order(la.Token(), lc.Token()))
	}
	return strings.Join(out, " ")
}

// order names how b compares with a: greater, equal or smaller.
func order(a, b uint64) string {
	switch {
	case b > a:
		return "greater"
	case b == a:
		return "equal"
	}
	return "smaller"
}

func tokensIncrease(t *testing.T, e *env) string {
	ctx := testCtx(t)
	c1, c2 := newClient(t, e.shared.addr), newClient(t, e.shared.addr)
	sessions := []*client.Session{newSession(t, ctx, c1), newSession(t, ctx, c2)}
	const key, other = "tokens/k", "tokens/other"
	var tokens []uint64
	for i := range 6 {
		s := sessions[i%2]
		l := acquire(t, ctx, s, key)
		tokens = append(tokens, l.Token())
		// Another key's grant between two grants of key moves the order on.
		lo := acquire(t, ctx, sessions[(i+1)%2], other)
		for _, x := range []*client.Lock{l, lo} {
			if err := x.Release(ctx); err != nil {
				t.Fatalf("Release(%s): %v", x.Key(), err)
			}
		}
	}
	increasing := true
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			increasing = false
			t.Errorf("tokens %v: grant %d's token is not greater than grant %d's", tokens, i, i-1)
		}
	}
	return fmt.Sprintf("grants=%d strictly-increasing=%v", len(tokens), increasing)
}

func fifoHandOver(t *testing.T, e *env) string {
	ctx := testCtx(t)
	const key = "fifo/k"
	hc := newClient(t, e.shared.addr)
	h := newSession(t, ctx, hc)
	names := map[string]string{h.ID(): "H"}
	lh := acquire(t, ctx, h, key)

	granted := make(chan grant, 3)
	for i := 1; i <= 3; i++ {
		who := fmt.Sprint(i)
		s := newSession(t, ctx, newClient(t, e.shared.addr)) // a client each
		names[s.ID()] = who
		acquireAsync(ctx, s, key, who, granted)
		waitQueued(t, ctx, hc, key, i) // queue them in this order
	}
	info, err := hc.Inspect(ctx, key)
	out := []string{"queue=" + holder(info, err, names)}

	var (
		grants []string
		tokens = []uint64{lh.Token()}
		next   = lh
	)
	for range 3 {
		if err := next.Release(ctx); err != nil {
			t.Fatalf("Release after grants %v: %v", grants, err)
		}
		g := await(t, granted, 20*time.Second, "the next waiter's grant")
		if g.err != nil {
			t.Fatalf("waiter %s Acquire: %v", g.who, g.err)
		}
		grants = append(grants, g.who)
		tokens = append(tokens, g.l.Token())
		next = g.l
	}
	if err := next.Release(ctx); err != nil {
		t.Fatalf("last Release: %v", err)
	}
	inc := "increasing"
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			inc = fmt.Sprint(tokens)
		}
	}
	return strings.Join(append(out, "grants=["+strings.Join(grants, " ")+"]", "tokens="+inc), " ")
}

func releaseRetry(t *testing.T, e *env) string {
	ctx := testCtx(t)
	c := newClient(t, e.shared.addr)
	api := rawAPI(t, e.shared.addr)
	a, b := newSession(t, ctx, c), newSession(t, ctx, c)
	names := map[string]string{a.ID(): "A", b.ID(): "B"}
	const key = "release-retry/k"
	var out []string

	la := acquire(t, ctx, a, key)
	t1 := la.Token()
	out = append(out, "release="+sdkErr(la.Release(ctx)))
	out = append(out, "release-again="+sdkErr(la.Release(ctx)))
	lb := acquire(t, ctx, b, key)
	t2 := lb.Token()
	if t2 <= t1 {
		t.Errorf("B's token %d; want > A's %d", t2, t1)
	}
	for _, r := range []struct {
		name  string
		sid   string
		token uint64
	}{
		{"stale(A,t1)", a.ID(), t1},
		{"stale(B,t1)", b.ID(), t1},
		{"other-session(A,t2)", a.ID(), t2},
	} {
		_, err := api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: r.sid, Key: key, Token: r.token})
		out = append(out, r.name+"="+wireErr(t, err))
	}
	info, err := c.Inspect(ctx, key)
	out = append(out, "inspect="+holder(info, err, names))
	if err == nil && info.Token != t2 {
		t.Errorf("Inspect token %d; want B's %d (the newer grant survives stale releases)", info.Token, t2)
	}
	out = append(out, "release(B)="+sdkErr(lb.Release(ctx)))
	return strings.Join(out, " ")
}

func revoke(t *testing.T, e *env) string {
	ctx := testCtx(t)
	const key = "revoke/k"
	hc, wc, admin := newClient(t, e.shared.addr), newClient(t, e.shared.addr), newClient(t, e.shared.addr)
	h, w := newSession(t, ctx, hc), newSession(t, ctx, wc)
	names := map[string]string{h.ID(): "H", w.ID(): "W"}
	var out []string

	lh := acquire(t, ctx, h, key)
	granted := make(chan grant, 1)
	acquireAsync(ctx, w, key, "W", granted)
	waitQueued(t, ctx, admin, key, 1)

	info, err := admin.Revoke(ctx, key)
	out = append(out, "revoke="+holder(info, err, names))
	if err == nil && info.Token != lh.Token() {
		t.Errorf("Revoke returned token %d; want the holder's %d", info.Token, lh.Token())
	}
	select {
	case <-lh.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("holder's Lock.Done not closed within 10s of the revoke")
	}
	out = append(out, "holder-done="+sdkErr(lh.Err()))
	if lh.Context().Err() == nil {
		t.Error("holder's Lock.Context not cancelled after the revoke")
	}
	// The holder's session stays live: it can take another lock.
	lo, err := h.Acquire(ctx, "revoke/other")
	if err == nil && !closed(h.Done()) {
		out = append(out, "holder-session=live")
		_ = lo.Release(ctx)
	} else {
		out = append(out, fmt.Sprintf("holder-session=%s/%s", sdkErr(err), sdkErr(h.Err())))
	}
	g := await(t, granted, 20*time.Second, "the waiter's grant after the revoke")
	out = append(out, "waiter="+sdkErr(g.err))
	if g.err == nil {
		out = append(out, "token="+order(lh.Token(), g.l.Token()))
	}
	out = append(out, "holder-release="+sdkErr(lh.Release(ctx)))
	info, err = admin.Revoke(ctx, "revoke/free")
	out = append(out, "revoke-free="+holder(info, err, names))
	return strings.Join(out, " ")
}

func watchOrder(t *testing.T, e *env) string {
	ctx := testCtx(t)
	const prefix, key, end = "watch/", "watch/k", "watch/zz-end"
	c, admin := newClient(t, e.shared.addr), newClient(t, e.shared.addr)
	a, b, cs := newSession(t, ctx, c), newSession(t, ctx, c), newSession(t, ctx, c)
	names := map[string]string{a.ID(): "A", b.ID(): "B", cs.ID(): "C"}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, err := admin.Watch(wctx, prefix)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}

	la := acquire(t, ctx, a, key)
	granted := make(chan grant, 1)
	acquireAsync(ctx, b, key, "B", granted)
	waitQueued(t, ctx, admin, key, 1)
	if err := la.Release(ctx); err != nil {
		t.Fatalf("A Release: %v", err)
	}
	g := await(t, granted, 20*time.Second, "B's grant")
	if g.err != nil {
		t.Fatalf("B Acquire: %v", g.err)
	}
	if _, err := admin.Revoke(ctx, key); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	lc := acquire(t, ctx, cs, key)
	if err := cs.Close(ctx); err != nil {
		t.Fatalf("C Close: %v", err)
	}
	// A last grant on another key: once its event arrives, every earlier
	// change has been reported (commit order).
	lend := acquire(t, ctx, a, end)

	wantTokens := []uint64{la.Token(), la.Token(), g.l.Token(), g.l.Token(), lc.Token(), lc.Token(), lend.Token()}
	var seen []string
	var tokens []uint64
	for {
		ev := await(t, events, 20*time.Second, fmt.Sprintf("watch event after %v", seen))
		if ev.Err != nil {
			t.Fatalf("watch broke after %v: %v", seen, ev.Err)
		}
		label := names[ev.Session]
		if label == "" {
			label = "other"
		}
		if ev.Key == end {
			label += ":end"
		}
		seen = append(seen, fmt.Sprintf("%s(%s)", ev.Kind, label))
		tokens = append(tokens, ev.Token)
		if ev.Key == end || len(seen) > 20 {
			break
		}
	}
	match := "match"
	if fmt.Sprint(tokens) != fmt.Sprint(wantTokens) {
		match = fmt.Sprint(tokens)
		t.Errorf("event tokens %v; want the grants' %v", tokens, wantTokens)
	}
	cancel()
	testkit.Eventually(t, 10*time.Second, "watch channel closed after cancel", func() bool {
		select {
		case _, ok := <-events:
			return !ok
		default:
			return false
		}
	})
	return "events=" + strings.Join(seen, ",") + " tokens=" + match
}

// clientSilence: a raw client opens a session, takes a lock, heartbeats
// once and then stays silent on its open stream. The server must close the
// session — not before the trust it granted has run out (docs/safety.md, "What
// the server may and may not do"), and within TTL + slack of the last
// heartbeat — and the waiter gets the key.
func clientSilence(t *testing.T, e *env) string {
	ctx := testCtx(t)
	const key = "silence/k"
	api := rawAPI(t, e.shared.addr)
	var out []string

	trust := time.Time{} // the silent client's deadline, before the margin
	extend := func(sent time.Time, remainingMs int64) {
		if d := sent.Add(ms(remainingMs)); d.After(trust) {
			trust = d
		}
	}
	sent := time.Now()
	o, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	extend(sent, o.RemainingMs)
	sent = time.Now()
	a, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: o.SessionId, Key: key})
	if err != nil || !a.Granted {
		t.Fatalf("Acquire = %v, %v; want granted", a, err)
	}
	extend(sent, a.RemainingMs)
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	stream, err := api.KeepAlive(sctx)
	if err != nil {
		t.Fatalf("KeepAlive: %v", err)
	}
	lastContact := time.Now()
	if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: o.SessionId, RequestId: 1}); err != nil {
		t.Fatalf("KeepAlive Send: %v", err)
	}
	r, err := stream.Recv()
	if err != nil || r.RequestId != 1 || !r.Live {
		t.Fatalf("first heartbeat answer %v, %v; want live", r, err)
	}
	extend(lastContact, r.RemainingMs)
	deadline := trust.Add(-ms(o.SafetyMarginMs))

	w := newSession(t, ctx, newClient(t, e.shared.addr))
	granted := make(chan grant, 1)
	acquireAsync(ctx, w, key, "W", granted)
	g := await(t, granted, ttl+slack+10*time.Second, "the waiter's grant after the holder fell silent")
	out = append(out, "waiter="+sdkErr(g.err))
	afterDeadline := !g.at.Before(deadline)
	if !afterDeadline {
		t.Errorf("waiter granted %v before the silent holder's deadline: trusted overlap", deadline.Sub(g.at))
	}
	took := g.at.Sub(lastContact)
	within := took <= ttl+slack
	if !within {
		t.Errorf("waiter granted %v after the last heartbeat; want within TTL %v + %v", took, ttl, slack)
	}
	t.Logf("waiter granted %v after the holder's last heartbeat (holder's deadline at %v)",
		took.Round(time.Millisecond), deadline.Sub(lastContact).Round(time.Millisecond))
	out = append(out, fmt.Sprintf("after-holder-deadline=%v within-ttl+slack=%v", afterDeadline, within))

	// The server tells the silent stream its session is dead (lock-loss
	// notices may come first).
	notice := "none"
	for notice == "none" {
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("KeepAlive Recv waiting for the dead notice: %v", err)
		}
		if r.RequestId == 0 && !r.Live && r.SessionId == o.SessionId {
			notice = "dead"
		}
	}
	out = append(out, "notice="+notice)
	_, err = api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: o.SessionId, Key: key, Token: a.Token})
	out = append(out, "old-release="+wireErr(t, err))
	out = append(out, "old-heartbeat="+liveness(heartbeat(t, ctx, api, o.SessionId)))
	return strings.Join(out, " ")
}

// childClientEnv, when set to "ADDR KEY", makes the test binary the client
// process of clientSigkill (see TestMain).
const childClientEnv = "LOCKD_PARITY_CHILD_CLIENT"

// runChildClient takes KEY on the lockd at ADDR with the SDK, prints
// "HELD <token> <session>" and holds the lock, heartbeating, until it is
// killed.
func runChildClient(spec string) int {
	// "ADDR KEY" or "ADDR KEY LIMIT" (a semaphore slot).
	addr, key, _ := strings.Cut(spec, " ")
	var opts []client.AcquireOption
	if k, lim, ok := strings.Cut(key, " "); ok {
		var n uint32
		if _, err := fmt.Sscan(lim, &n); err != nil {
			fmt.Println("ERROR", err)
			return 1
		}
		key, opts = k, append(opts, client.WithLimit(n))
	}
	c, err := client.New(addr)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := c.NewSession(ctx)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	l, err := s.Acquire(ctx, key, opts...)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	fmt.Printf("HELD %d %s\n", l.Token(), s.ID())
	<-ctx.Done() // the parent kills us long before
	return 1
}

func clientSigkill(t *testing.T, e *env) string {
	ctx := testCtx(t)
	const key = "client-sigkill/k"
	child, line := startProc(t, "client", os.Args[0], []string{"-test.run=^$"},
		[]string{childClientEnv + "=" + e.shared.addr + " " + key}, "HELD ")
	var (
		childToken   uint64
		childSession string
	)
	if _, err := fmt.Sscanf(line, "HELD %d %s", &childToken, &childSession); err != nil {
		t.Fatalf("client process said %q: %v", line, err)
	}
	c := newClient(t, e.shared.addr)
	w := newSession(t, ctx, c)
	granted := make(chan grant, 1)
	acquireAsync(ctx, w, key, "W", granted)
	waitQueued(t, ctx, c, key, 1)
	if info, err := c.Inspect(ctx, key); err != nil || info.Session != childSession {
		t.Fatalf("Inspect = %+v, %v; want held by the client process's session %s", info, err, childSession)
	}

	killedAt := time.Now()
	child.kill(t)
	g := await(t, granted, ttl+slack+10*time.Second, "the waiter's grant after SIGKILL of the holder")
	if g.err != nil {
		t.Fatalf("waiter Acquire: %v", g.err)
	}
	took := g.at.Sub(killedAt)
	within := took <= ttl+slack
	if !within {
		t.Errorf("waiter granted %v after the kill; want within TTL %v + %v", took, ttl, slack)
	}
	t.Logf("waiter granted %v after SIGKILL of the client", took.Round(time.Millisecond))
	return fmt.Sprintf("waiter=ok within-ttl+slack=%v token=%s", within, order(childToken, g.l.Token()))
}

// lockdSigkill: lockd dies (SIGKILL) while a client holds two locks. The
// backend frees them within TTL + slack (for the embedded backend, counted
// from the restart: its etcd died too), a waiter on a new lockd gets both,
// and the holder stopped trusting each lock before the waiter got it.
func lockdSigkill(t *testing.T, e *env) string {
	ctx := testCtx(t)
	keys := []string{"lockd-sigkill/a", "lockd-sigkill/b"}
	first := e.fresh(t)
	h := newSession(t, ctx, newClient(t, first.addr))
	held := make([]*client.Lock, len(keys))
	for i, k := range keys {
		held[i] = acquire(t, ctx, h, k)
	}

	killedAt := time.Now()
	first.kill(t)
	second := first.restart(t, e.bins)
	readyAfter := time.Since(killedAt)
	w := newSession(t, ctx, newClient(t, second.addr))
	granted := make(chan grant, len(keys))
	for _, k := range keys {
		acquireAsync(ctx, w, k, k, granted)
	}

	var results []string
	firstOK, greater, within := true, true, true
	for range keys {
		g := await(t, granted, readyAfter+ttl+slack+10*time.Second, "a waiter's grant on the new lockd")
		results = append(results, sdkErr(g.err))
		if g.err != nil {
			t.Errorf("waiter Acquire(%s) on the new lockd: %v", g.who, g.err)
			continue
		}
		i := 0
		if g.who == keys[1] {
			i = 1
		}
		if !closed(held[i].Done()) {
			firstOK = false
			t.Errorf("%s granted to the waiter while the killed lockd's client still trusted it", g.who)
		}
		if g.l.Token() <= held[i].Token() {
			greater = false
			t.Errorf("%s: waiter token %d; want > the old holder's %d", g.who, g.l.Token(), held[i].Token())
		}
		took := g.at.Sub(killedAt)
		if took > readyAfter+ttl+slack {
			within = false
			t.Errorf("%s granted %v after the kill (new lockd ready after %v); want within %v + TTL %v + %v",
				g.who, took, readyAfter, readyAfter, ttl, slack)
		}
		t.Logf("%s granted on the new lockd %v after SIGKILL (new lockd ready after %v)", g.who,
			took.Round(time.Millisecond), readyAfter.Round(time.Millisecond))
	}
	tokens := "greater"
	if !greater {
		tokens = "not-greater"
	}
	return fmt.Sprintf("waiters-on-new-lockd=%s within-ttl+slack=%v holder-trust-ended-first=%v holder-err=%s tokens=%s",
		strings.Join(results, ","), within, firstOK, sdkErr(h.Err()), tokens)
}

func fencingRestart(t *testing.T, e *env) string {
	ctx := testCtx(t)
	const key = "fencing/k"
	first := e.fresh(t)
	c := newClient(t, first.addr)
	s := newSession(t, ctx, c)
	l := acquire(t, ctx, s, key)
	before := l.Token()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("client Close: %v", err)
	}
	first.stop(t) // fails the test unless lockd exits 0
	stop := "clean"
	if t.Failed() {
		stop = "unclean"
	}

	second := first.restart(t, e.bins)
	s2 := newSession(t, ctx, newClient(t, second.addr))
	after := acquire(t, ctx, s2, key).Token()
	t.Logf("token before the restart %d, after %d", before, after)
	return fmt.Sprintf("stop=%s token-after-restart=%s", stop, order(before, after))
}

// restartSemanticsTTL is the session TTL of restartSemantics: long enough
// for lockd (and the embedded etcd) to restart before the session expires.
const restartSemanticsTTL = 10 * time.Second

// restartSemantics: a client's session and lock, then SIGKILL of lockd and
// a restart within the TTL; the client reconnects to the new lockd with
// the old session id. On the embedded etcd the session is gone with the old
// process (the restarted store raised the epoch and adopts no session of an
// earlier one; the key stays until the lease expires); on an external etcd
// the new lockd adopts the session from its record (issue 13) and on
// PostgreSQL the session row survives: the client carries on.
func restartSemantics(t *testing.T, e *env) string {
	ctx := testCtx(t)
	const key = "restart-semantics/k"
	first := e.fresh(t)
	api := rawAPI(t, first.addr)
	o, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: restartSemanticsTTL.Milliseconds()})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	sid := o.SessionId
	names := map[string]string{sid: "old"}
	a, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: key})
	if err != nil || !a.Granted {
		t.Fatalf("Acquire = %v, %v; want granted", a, err)
	}
	if r := heartbeat(t, ctx, api, sid); !r.Live {
		t.Fatalf("heartbeat before the kill: %s; want live", liveness(r))
	}

	killedAt := time.Now()
	first.kill(t)
	second := first.restart(t, e.bins)
	since := time.Since(killedAt)
	if since > restartSemanticsTTL-2*time.Second {
		t.Fatalf("lockd took %v to restart; the scenario needs it well within the session TTL %v", since, restartSemanticsTTL)
	}
	t.Logf("new lockd ready %v after SIGKILL", since.Round(time.Millisecond))
	api2 := rawAPI(t, second.addr)
	c2 := newClient(t, second.addr)
	var out []string

	out = append(out, "heartbeat="+liveness(heartbeat(t, ctx, api2, sid)))
	a2, err := api2.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: key})
	switch {
	case err != nil:
		out = append(out, "acquire="+wireErr(t, err))
	case a2.Granted && a2.Token == a.Token:
		out = append(out, "acquire=granted(same-token)")
	default:
		out = append(out, fmt.Sprintf("acquire=granted=%v(token %d, was %d)", a2.Granted, a2.Token, a.Token))
	}
	info, err := c2.Inspect(ctx, key)
	out = append(out, "inspect="+holder(info, err, names))
	cl, err := api2.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: sid})
	if err != nil {
		t.Fatalf("CloseSession through the new lockd: %v", err)
	}
	out = append(out, fmt.Sprintf("close=released-%d", cl.Released))
	info, err = c2.Inspect(ctx, key)
	out = append(out, "after-close="+holder(info, err, names))

	// Either way the key is free for a new session in the end: at once
	// where the close released it, after the old lease's TTL otherwise.
	w := newSession(t, ctx, c2)
	granted := make(chan grant, 1)
	acquireAsync(ctx, w, key, "W", granted)
	g := await(t, granted, restartSemanticsTTL+slack+10*time.Second, "the new session's grant")
	out = append(out, "waiter="+sdkErr(g.err))
	if took := g.at.Sub(killedAt); g.err == nil && took > restartSemanticsTTL+slack {
		t.Errorf("new session granted %v after the kill; want within TTL %v + %v", took, restartSemanticsTTL, slack)
	}
	if g.err == nil && g.l.Token() <= a.Token {
		t.Errorf("new session's token %d; want > the old session's %d", g.l.Token(), a.Token)
	}
	return strings.Join(out, " ")
}

// badKeyNames label badKeys in outcomes.
var badKeyNames = []string{"empty", "NUL", "513B", "non-UTF-8"}

// grouped collects the results of bad-input cases and prints them grouped by
// result, results in first-seen order: "R1: a b; R2: c".
type grouped struct {
	results []string
	names   map[string][]string
}

func (g *grouped) add(name, result string) {
	if g.names == nil {
		g.names = map[string][]string{}
	}
	if _, ok := g.names[result]; !ok {
		g.results = append(g.results, result)
	}
	g.names[result] = append(g.names[result], name)
}

// addKeys adds the results of one operation over the bad keys: one case
// op(bad-keys) when they agree, else one case per key.
func (g *grouped) addKeys(op string, results []string) {
	uniform := true
	for _, r := range results[1:] {
		uniform = uniform && r == results[0]
	}
	if uniform {
		g.add(op+"(bad-keys)", results[0])
		return
	}
	for i, r := range results {
		g.add(op+"(key="+badKeyNames[i]+")", r)
	}
}

func (g *grouped) String() string {
	parts := make([]string, len(g.results))
	for i, r := range g.results {
		parts[i] = r + ": " + strings.Join(g.names[r], " ")
	}
	return strings.Join(parts, "; ")
}

func badInputSDK(t *testing.T, e *env) string {
	ctx := testCtx(t)
	c := newClient(t, e.shared.addr)
	var out grouped

	_, err := c.NewSession(ctx, client.WithSessionTTL(time.Second))
	out.add("open(ttl=1s)", sdkErr(err))
	s := newSession(t, ctx, c)
	var acq, try, insp, rev []string
	for _, k := range badKeys {
		_, err := s.Acquire(ctx, k)
		acq = append(acq, sdkErr(err))
		_, err = s.TryAcquire(ctx, k)
		try = append(try, sdkErr(err))
		_, err = c.Inspect(ctx, k)
		insp = append(insp, sdkErr(err))
		_, err = c.Revoke(ctx, k)
		rev = append(rev, sdkErr(err))
	}
	out.addKeys("acquire", acq)
	out.addKeys("try", try)
	out.addKeys("inspect", insp)
	out.addKeys("revoke", rev)
	for _, d := range []time.Duration{-time.Second, 11 * time.Minute} {
		_, err := s.Acquire(ctx, "bad-input-sdk/k", client.WithWaitTimeout(d))
		out.add("wait-timeout="+d.String(), sdkErr(err))
	}
	_, _, err = c.List(ctx, "", client.ListOptions{Limit: 5000})
	out.add("list(limit=5000)", sdkErr(err))
	_, _, err = c.List(ctx, "", client.ListOptions{PageToken: "%%junk%%"})
	out.add("list(token=junk)", sdkErr(err))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, err = c.Watch(wctx, "a\x00")
	out.add("watch(prefix=NUL)", sdkErr(err))
	closedSession := newSession(t, ctx, c)
	if err := closedSession.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_, err = closedSession.Acquire(ctx, "bad-input-sdk/k")
	out.add("acquire(closed-session)", sdkErr(err))
	return out.String()
}

func badInputWire(t *testing.T, e *env) string {
	ctx := testCtx(t)
	api := rawAPI(t, e.shared.addr)
	var out grouped
	add := func(name string, err error) { out.add(name, wireErr(t, err)) }

	_, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: 1000})
	add("open(ttl=1s)", err)
	_, err = api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: (2 * time.Hour).Milliseconds()})
	add("open(ttl=2h)", err)
	o, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	defer func() {
		_, _ = api.CloseSession(context.WithoutCancel(ctx), &lockdv1.CloseSessionRequest{SessionId: o.SessionId})
	}()
	const unknown = "0123456789abcdef0123456789abcdef" // well-formed, never opened
	_, err = api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: "", Key: "bad-input-wire/k"})
	add("acquire(session=empty)", err)
	_, err = api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: "bad\x01id", Key: "bad-input-wire/k"})
	add("acquire(session=ctl-char)", err)
	var keys []string
	for _, k := range badWireKeys {
		_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: o.SessionId, Key: k, Wait: true})
		keys = append(keys, wireErr(t, err))
	}
	out.addKeys("acquire", keys)
	_, err = api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: o.SessionId, Key: "bad-input-wire/k", WaitTimeoutMs: 100})
	add("acquire(try+timeout)", err)
	_, err = api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: o.SessionId, Key: "bad-input-wire/k", Wait: true, WaitTimeoutMs: -1})
	add("acquire(timeout<0)", err)
	_, err = api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: o.SessionId, Key: "bad-input-wire/k", Token: 0})
	add("release(token=0)", err)
	_, err = api.Inspect(ctx, &lockdv1.InspectRequest{Key: ""})
	add("inspect(key=empty)", err)
	_, err = api.List(ctx, &lockdv1.ListRequest{Limit: 5000})
	add("list(limit=5000)", err)
	_, err = api.List(ctx, &lockdv1.ListRequest{PageToken: "%%junk%%"})
	add("list(token=junk)", err)
	_, err = api.Revoke(ctx, &lockdv1.RevokeRequest{Key: ""})
	add("revoke(key=empty)", err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ws, err := api.Watch(wctx, &lockdv1.WatchRequest{Prefix: "a\x00"})
	if err == nil {
		_, err = ws.Recv()
	}
	add("watch(prefix=NUL)", err)
	out.add("heartbeat(request_id=0)", liveness(heartbeatRequest0(t, ctx, api, o.SessionId)))

	// Well-formed requests naming a session or grant that does not exist.
	_, err = api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: unknown, Key: "bad-input-wire/k"})
	add("acquire(unknown-session)", err)
	_, err = api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: unknown, Key: "bad-input-wire/k", Token: 1})
	add("release(unknown-session)", err)
	out.add("heartbeat(unknown-session)", liveness(heartbeat(t, ctx, api, unknown)))
	cl, err := api.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: unknown})
	if err != nil {
		add("close(unknown-session)", err)
	} else {
		out.add("close(unknown-session)", fmt.Sprintf("released-%d", cl.Released))
	}

	// A wait that times out behind another session's grant.
	other, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	defer func() {
		_, _ = api.CloseSession(context.WithoutCancel(ctx), &lockdv1.CloseSessionRequest{SessionId: other.SessionId})
	}()
	if g, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: other.SessionId, Key: "bad-input-wire/held"}); err != nil || !g.Granted {
		t.Fatalf("Acquire(held) = %v, %v; want granted", g, err)
	}
	_, err = api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: o.SessionId, Key: "bad-input-wire/held", Wait: true, WaitTimeoutMs: 200})
	add("acquire(wait=200ms,held)", err)
	return out.String()
}

// heartbeatRequest0 sends a KeepAlive request with request_id 0 (invalid)
// and returns the reply, which echoes request_id 0 with an error set.
func heartbeatRequest0(t *testing.T, ctx context.Context, api lockdv1.LockServiceClient, id string) *lockdv1.KeepAliveResponse {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	stream, err := api.KeepAlive(sctx)
	if err != nil {
		t.Fatalf("KeepAlive: %v", err)
	}
	if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: id}); err != nil {
		t.Fatalf("KeepAlive Send: %v", err)
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatalf("KeepAlive Recv: %v", err)
	}
	_ = stream.CloseSend()
	return r
}
