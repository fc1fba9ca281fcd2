package server_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/store"
)

// TestWatchHolder: C2 #ct2-holder on the wire. A Watch that asks for holder
// gets the owner, labels and value with acquired events and a value event
// (with the new value) for every SetValue; SetValue never changes the token
// and refuses a stale one (NOT_OWNER); a Watch without holder (an older
// client) sees neither values nor value events.
func TestWatchHolder(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testCtx(t, time.Minute)
		api := dial(t, srv.Addr)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		watch := func(holder bool) lockdv1.LockService_WatchClient {
			t.Helper()
			w, err := api.Watch(wctx, &lockdv1.WatchRequest{Prefix: "wh/", Holder: holder})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Header(); err != nil {
				t.Fatalf("Watch header: %v", err)
			}
			return w
		}
		withHolder, plain := watch(true), watch(false)

		labels := map[string]string{"job": "elect"}
		sess, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: longTTL.Milliseconds(), Owner: "web-3", Labels: labels})
		if err != nil {
			t.Fatal(err)
		}
		acq, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sess.SessionId, Key: "wh/a", Value: []byte("v1")})
		if err != nil || !acq.Granted {
			t.Fatalf("Acquire = %v, %v", acq, err)
		}
		if _, err := api.SetValue(ctx, &lockdv1.SetValueRequest{SessionId: sess.SessionId, Key: "wh/a", Token: acq.Token, Value: []byte("v2")}); err != nil {
			t.Fatalf("SetValue: %v", err)
		}
		_, err = api.SetValue(ctx, &lockdv1.SetValueRequest{SessionId: sess.SessionId, Key: "wh/a", Token: acq.Token + 1, Value: []byte("x")})
		if st := status.Convert(err); st.Code() != codes.PermissionDenied || wireerr.Reason(st) != wireerr.ReasonNotOwner {
			t.Fatalf("SetValue(stale token) = %v; want NOT_OWNER", err)
		}
		in, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: "wh/a"})
		if err != nil || in.Lock.Token != acq.Token || !bytes.Equal(in.Lock.Value, []byte("v2")) {
			t.Fatalf("Inspect after SetValue = %v, %v; want token %d value v2", in, err, acq.Token)
		}
		recv := func(w lockdv1.LockService_WatchClient, what string) *lockdv1.WatchResponse {
			t.Helper()
			ev, err := w.Recv()
			if err != nil {
				t.Fatalf("%s: Recv: %v", what, err)
			}
			return ev
		}
		// The acquired event's value is read when it is sent: v1 or v2.
		ev := recv(withHolder, "holder")
		if ev.Kind != lockdv1.EventKind_EVENT_KIND_ACQUIRED || ev.Token != acq.Token || ev.Owner != "web-3" || !maps.Equal(ev.Labels, labels) {
			t.Fatalf("first event = %v; want acquired by web-3 with labels", ev)
		}
		// Value events (Acquire's, SetValue's) each carry the value read
		// when sent, until one carries v2.
		for !bytes.Equal(ev.Value, []byte("v2")) {
			ev = recv(withHolder, "holder")
			if ev.Kind != lockdv1.EventKind_EVENT_KIND_VALUE || ev.Token != acq.Token || ev.Owner != "web-3" {
				t.Fatalf("event = %v; want a value event of token %d by web-3", ev, acq.Token)
			}
		}
		if _, err := api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: sess.SessionId, Key: "wh/a", Token: acq.Token}); err != nil {
			t.Fatal(err)
		}
		for ev.Kind == lockdv1.EventKind_EVENT_KIND_VALUE || ev.Kind == lockdv1.EventKind_EVENT_KIND_ACQUIRED {
			ev = recv(withHolder, "holder")
		}
		if ev.Kind != lockdv1.EventKind_EVENT_KIND_RELEASED || ev.Token != acq.Token || ev.Value != nil {
			t.Errorf("event after the values = %v; want released, without a value", ev)
		}

		for _, want := range []lockdv1.EventKind{lockdv1.EventKind_EVENT_KIND_ACQUIRED, lockdv1.EventKind_EVENT_KIND_RELEASED} {
			ev := recv(plain, "plain")
			if ev.Kind != want || ev.Owner != "" || ev.Value != nil {
				t.Errorf("plain watch: %v; want %v without holder fields", ev, want)
			}
		}
	})
}

// TestValuesFollowReadAccess: a value is readable exactly by whoever may
// read its key (C2 #ct2-holder, C5 #ct5-auth). A reader of a/ watching ""
// with holder gets the values of a/ and no event (so no value) of b/;
// Inspect of b/ is refused and List leaves it out; SetValue needs lock on
// the key.
func TestValuesFollowReadAccess(t *testing.T) {
	az, _ := authFiles(t, filterPolicy, "root", "reader")
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{Auth: az, NoClient: true})
	api := dial(t, srv.Addr)
	ctx := testCtx(t, time.Minute)
	root, reader := as(ctx, "root"), as(ctx, "reader")
	sid := openRaw(t, root, api, longTTL).SessionId

	wctx, cancel := context.WithCancel(reader)
	defer cancel()
	w, err := api.Watch(wctx, &lockdv1.WatchRequest{Prefix: "", Holder: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Header(); err != nil {
		t.Fatalf("Watch header: %v", err)
	}
	acquire := func(k, v string) uint64 {
		t.Helper()
		r, err := api.Acquire(root, &lockdv1.AcquireRequest{SessionId: sid, Key: k, Value: []byte(v)})
		if err != nil || !r.Granted {
			t.Fatalf("Acquire(%s) = %v, %v", k, r, err)
		}
		return r.Token
	}
	tb := acquire("b/x", "secret-b")
	if _, err := api.SetValue(root, &lockdv1.SetValueRequest{SessionId: sid, Key: "b/x", Token: tb, Value: []byte("secret-b2")}); err != nil {
		t.Fatalf("SetValue(b/x) as root: %v", err)
	}
	ta := acquire("a/x", "va")

	for {
		ev, err := w.Recv()
		if err != nil {
			t.Fatalf("Watch Recv: %v", err)
		}
		if ev.Key != "a/x" {
			t.Fatalf("reader's watch got %v; only a/x is readable", ev)
		}
		if ev.Kind == lockdv1.EventKind_EVENT_KIND_VALUE || bytes.Equal(ev.Value, []byte("va")) {
			if !bytes.Equal(ev.Value, []byte("va")) || ev.Token != ta {
				t.Fatalf("a/x event = %v; want value va, token %d", ev, ta)
			}
			break
		}
	}
	if _, err := api.Inspect(reader, &lockdv1.InspectRequest{Key: "b/x"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Inspect(b/x) as reader = %v; want PERMISSION_DENIED", err)
	}
	ls, err := api.List(reader, &lockdv1.ListRequest{})
	if err != nil || len(ls.Locks) != 1 || ls.Locks[0].Key != "a/x" || !bytes.Equal(ls.Locks[0].Value, []byte("va")) {
		t.Errorf("List(\"\") as reader = %v, %v; want a/x with its value only", ls, err)
	}
	_, err = api.SetValue(reader, &lockdv1.SetValueRequest{SessionId: sid, Key: "a/x", Token: ta, Value: []byte("forged")})
	if st := status.Convert(err); st.Code() != codes.PermissionDenied || wireerr.Reason(st) != wireerr.ReasonAccessDenied {
		t.Errorf("SetValue(a/x) as reader = %v; want ACCESS_DENIED", err)
	}
}

// readGate wraps a store: Inspect of key counts and, while armed, waits
// for open; the events of WatchFrom(prefix) (what the server's Watch
// calls) are passed on through a buffer and
// each is announced on delivered once it is queued for the server.
type readGate struct {
	store.LockStore
	key, prefix string
	delivered   chan store.Event

	mu      sync.Mutex
	reads   int
	armed   bool
	entered chan struct{}
	open    chan struct{}
}

func (g *readGate) Inspect(ctx context.Context, key string) (store.LockInfo, bool, error) {
	if key == g.key {
		g.mu.Lock()
		g.reads++
		armed, entered, open := g.armed, g.entered, g.open
		g.armed = false
		g.mu.Unlock()
		if armed {
			entered <- struct{}{}
			select {
			case <-open:
			case <-ctx.Done():
				return store.LockInfo{}, false, ctx.Err()
			}
		}
	}
	return g.LockStore.Inspect(ctx, key)
}

// arm makes the next Inspect of key wait for the returned open; entered
// receives when it started waiting.
func (g *readGate) arm() (entered <-chan struct{}, open chan<- struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.entered, g.open = true, make(chan struct{}, 1), make(chan struct{})
	return g.entered, g.open
}

func (g *readGate) readCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reads
}

func (g *readGate) WatchFrom(ctx context.Context, prefix, after string) (string, <-chan store.Event, error) {
	start, in, err := g.LockStore.WatchFrom(ctx, prefix, after)
	if err != nil || prefix != g.prefix {
		return start, in, err
	}
	out := make(chan store.Event, 512)
	go func() { // exits when the store closes in (ctx ended)
		defer close(out)
		for ev := range in {
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
			select {
			case g.delivered <- ev:
			default: // nobody counts
			}
		}
	}()
	return start, out, nil
}

// TestWatchHolderCoalesces: a Watch with holder reads a key once for all
// of its events that queued up while an earlier read was slow, so the
// stream keeps up (the election row's Observe backlog, issue #15), and the
// holder fields stay C2 #ct2-holder's: what the grant has when the event
// is sent, only if the grant is still the event's. Before the fix every
// event was read on its own: 7 then 3 reads below instead of 2 and 2.
func TestWatchHolderCoalesces(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		g := &readGate{key: "co/a", prefix: "co/", delivered: make(chan store.Event, 512)}
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true,
			Wrap: func(st store.LockStore) store.LockStore { g.LockStore = st; return g }})
		ctx := testCtx(t, time.Minute)
		api := dial(t, srv.Addr)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		w, err := api.Watch(wctx, &lockdv1.WatchRequest{Prefix: "co/", Holder: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Header(); err != nil {
			t.Fatalf("Watch header: %v", err)
		}
		open := func(owner string) string {
			t.Helper()
			s, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: longTTL.Milliseconds(), Owner: owner})
			if err != nil {
				t.Fatal(err)
			}
			return s.SessionId
		}
		s1, s2 := open("s1"), open("s2")
		// awaitQueued waits until n events of the watch are queued for the
		// server.
		awaitQueued := func(n int) {
			t.Helper()
			for range n {
				select {
				case <-g.delivered:
				case <-ctx.Done():
					t.Fatalf("waiting for %d queued events: %v", n, ctx.Err())
				}
			}
		}
		recv := func() *lockdv1.WatchResponse {
			t.Helper()
			ev, err := w.Recv()
			if err != nil {
				t.Fatalf("Watch Recv: %v", err)
			}
			return ev
		}
		setValue := func(sid string, token uint64, v string) {
			t.Helper()
			if _, err := api.SetValue(ctx, &lockdv1.SetValueRequest{SessionId: sid, Key: "co/a", Token: token, Value: []byte(v)}); err != nil {
				t.Fatalf("SetValue(%s): %v", v, err)
			}
		}

		// 1. The read of the acquired event is slow; Acquire's value and
		// five SetValues queue up meanwhile.
		entered, gate := g.arm()
		acq, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: s1, Key: "co/a", Value: []byte("v0")})
		if err != nil || !acq.Granted {
			t.Fatalf("Acquire = %v, %v", acq, err)
		}
		<-entered
		for i := 1; i <= 5; i++ {
			setValue(s1, acq.Token, fmt.Sprintf("v%d", i))
		}
		awaitQueued(7) // acquired, value v0, values v1..v5
		before := g.readCount()
		close(gate)
		for i := range 7 {
			ev := recv()
			want := lockdv1.EventKind_EVENT_KIND_VALUE
			if i == 0 {
				want = lockdv1.EventKind_EVENT_KIND_ACQUIRED
			}
			// Every read came after v5 was set: every event carries it.
			if ev.Kind != want || ev.Token != acq.Token || ev.Owner != "s1" || string(ev.Value) != "v5" {
				t.Fatalf("event %d = %v; want %v of token %d by s1 with value v5", i, ev, want, acq.Token)
			}
		}
		if reads := g.readCount() - before + 1; reads != 2 {
			t.Errorf("%d reads of co/a for 7 events (one slow read, the rest queued); want 2", reads)
		}

		// 2. A value event's read is slow; meanwhile its grant is released
		// and the key granted to s2 with a value. The value event of the
		// gone grant is not sent; s2's events carry s2's holder fields.
		entered, gate = g.arm()
		before = g.readCount()
		setValue(s1, acq.Token, "v6")
		<-entered
		if _, err := api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: s1, Key: "co/a", Token: acq.Token}); err != nil {
			t.Fatal(err)
		}
		acq2, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: s2, Key: "co/a", Value: []byte("w")})
		if err != nil || !acq2.Granted {
			t.Fatalf("Acquire(s2) = %v, %v", acq2, err)
		}
		awaitQueued(4) // value v6, released, acquired, value w
		close(gate)
		if ev := recv(); ev.Kind != lockdv1.EventKind_EVENT_KIND_RELEASED || ev.Token != acq.Token || ev.Value != nil {
			t.Fatalf("first event after the slow read = %v; want s1's release (its value event is nobody's now)", ev)
		}
		for _, want := range []lockdv1.EventKind{lockdv1.EventKind_EVENT_KIND_ACQUIRED, lockdv1.EventKind_EVENT_KIND_VALUE} {
			if ev := recv(); ev.Kind != want || ev.Token != acq2.Token || ev.SessionId != s2 || ev.Owner != "s2" || string(ev.Value) != "w" {
				t.Fatalf("event = %v; want %v of token %d by s2 with value w", ev, want, acq2.Token)
			}
		}
		if reads := g.readCount() - before; reads != 2 {
			t.Errorf("%d reads of co/a for 4 events (one slow read, the rest queued); want 2", reads)
		}

		// 3. Events of two keys queued behind a slow read: each key is
		// read for its own events (the reads of a batch run side by side).
		entered, gate = g.arm()
		setValue(s2, acq2.Token, "w2")
		<-entered
		acqB, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: s1, Key: "co/b", Value: []byte("b")})
		if err != nil || !acqB.Granted {
			t.Fatalf("Acquire(co/b) = %v, %v", acqB, err)
		}
		setValue(s2, acq2.Token, "w3")
		awaitQueued(4) // value w2, acquired co/b, value b, value w3
		close(gate)
		got := map[string][]string{}
		for range 4 {
			ev := recv()
			got[ev.Key] = append(got[ev.Key], fmt.Sprintf("%v %s %s", ev.Kind, ev.Owner, ev.Value))
		}
		want := map[string][]string{
			"co/a": {"EVENT_KIND_VALUE s2 w3", "EVENT_KIND_VALUE s2 w3"},
			"co/b": {"EVENT_KIND_ACQUIRED s1 b", "EVENT_KIND_VALUE s1 b"},
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("events of two keys behind a slow read = %v; want %v", got, want)
		}
	})
}
