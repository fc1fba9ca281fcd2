package server_test

import (
	"bytes"
	"context"
	"maps"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
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
