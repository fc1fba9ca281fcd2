package server_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/server"
	"lock.dev/lockd/store"
)

// TestStoppingRefusesNewWork: once Shutdown has ended the streams and waits,
// a call that retries what that end broke can still reach the replica
// before its connection is told to go away (here gRPC keeps serving: the
// test does that step alone). New Watch and KeepAlive streams, OpenSession
// and Acquire are refused with SHUTTING_DOWN, and none reaches the store (C2
// #ct2-stopping-refuses). The old code served the Watch: a client re-opening
// its watch after its stream ended got a PostgreSQL resync from a stream
// about to end (client.TestErrorsRoundTrip/pg, 1 of 20 stress runs); here
// it fails with "reached the store after the streams ended: [watch w/ …]".
func TestStoppingRefusesNewWork(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		rec := &stopRecorder{}
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true,
			Wrap: func(st store.LockStore) store.LockStore { rec.LockStore = st; return rec }})
		ctx := testCtx(t, 60*time.Second)
		api := dial(t, srv.Addr)
		sess := openRaw(t, ctx, api, longTTL)
		// A watch established before: the one whose end a client retries.
		before, err := api.Watch(ctx, &lockdv1.WatchRequest{Prefix: "w/", Progress: true})
		if err != nil {
			t.Fatalf("Watch before the stop: %v", err)
		}
		md, err := before.Header()
		if err != nil || len(md.Get("lockd-watch-cursor")) != 1 {
			t.Fatalf("Watch before the stop: headers %v, %v; want a cursor", md, err)
		}
		cursor := md.Get("lockd-watch-cursor")[0]

		server.EndStreams(srv.Server)
		for {
			if _, err := before.Recv(); err != nil {
				if status.Code(err) != codes.Unavailable || reason(err) != wireerr.ReasonShuttingDown {
					t.Fatalf("the open watch ended with %v; want UNAVAILABLE SHUTTING_DOWN", err)
				}
				break
			}
		}
		rec.arm()

		refused := func(what string, err error) {
			t.Helper()
			if status.Code(err) != codes.Unavailable || reason(err) != wireerr.ReasonShuttingDown {
				t.Errorf("%s after the streams ended: %v; want UNAVAILABLE SHUTTING_DOWN", what, err)
			}
		}
		// The watch re-opened after its cursor, as the SDK does.
		w, err := api.Watch(ctx, &lockdv1.WatchRequest{Prefix: "w/", ResumeAfter: cursor, Progress: true})
		if err == nil {
			for {
				var r *lockdv1.WatchResponse
				if r, err = w.Recv(); err != nil {
					break
				}
				if r.GetKind() != lockdv1.EventKind_EVENT_KIND_PROGRESS {
					t.Errorf("re-opened watch after the streams ended delivered %v", r)
				}
			}
		}
		refused("Watch re-opened after its cursor", err)
		_, err = api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sess.SessionId, SessionSecret: sess.SessionSecret,
			Key: "stop/k", Wait: true})
		refused("Acquire", err)
		_, err = api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: longTTL.Milliseconds()})
		refused("OpenSession", err)
		ka, err := api.KeepAlive(ctx)
		if err == nil {
			_, err = ka.Recv()
		}
		refused("KeepAlive stream", err)
		if got := rec.reached(); len(got) > 0 {
			t.Errorf("reached the store after the streams ended: %v", got)
		}
	})
}

// stopRecorder records the test's own calls that reach the store once
// armed: watches of "w/", grant attempts on "stop/" keys, opens (the server
// opens no session of its own, and its lock-loss watch is of every key).
type stopRecorder struct {
	store.LockStore

	mu    sync.Mutex
	armed bool
	calls []string
}

func (r *stopRecorder) arm() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed = true
}

func (r *stopRecorder) record(call string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.armed {
		r.calls = append(r.calls, call)
	}
}

func (r *stopRecorder) reached() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func (r *stopRecorder) WatchFrom(ctx context.Context, prefix, after string) (string, <-chan store.Event, error) {
	if prefix == "w/" {
		r.record("watch " + prefix + " after " + after)
	}
	return r.LockStore.WatchFrom(ctx, prefix, after)
}

func (r *stopRecorder) TryInsert(ctx context.Context, id store.SessionID, key string, opts ...store.AcquireOption) (store.Grant, bool, error) {
	r.record("try_insert " + key)
	return r.LockStore.TryInsert(ctx, id, key, opts...)
}

func (r *stopRecorder) Acquire(ctx context.Context, id store.SessionID, key string, opts ...store.AcquireOption) (store.Grant, error) {
	r.record("acquire " + key)
	return r.LockStore.Acquire(ctx, id, key, opts...)
}

func (r *stopRecorder) OpenSession(ctx context.Context, ttl time.Duration, opts ...store.SessionOption) (store.Session, error) {
	r.record("open_session")
	return r.LockStore.OpenSession(ctx, ttl, opts...)
}
