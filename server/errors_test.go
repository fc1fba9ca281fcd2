package server_test

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/store"
)

// TestEveryReasonOnTheWire makes a real server send every reason of the
// wire vocabulary (proto/lockd/v1/wireerr) and checks that each travels with
// its code and a message, and that invalid input names its field as data.
// The SDK's side of the round trip is client.TestErrorsRoundTrip.
func TestEveryReasonOnTheWire(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		var faulty *lockdtest.Faulty
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true,
			Wrap: func(st store.LockStore) store.LockStore { faulty = lockdtest.NewFaulty(st); return faulty }})
		ctx := testCtx(t, 60*time.Second)
		api := dial(t, srv.Addr)
		seen := map[string]bool{}
		check := func(what string, err error, want string) {
			t.Helper()
			st := status.Convert(err)
			if got := wireerr.Reason(st); got != want || st.Code() != wireerr.Code(want) || st.Message() == "" {
				t.Errorf("%s: got %v (reason %q); want code %v, reason %s and a message", what, err, got, wireerr.Code(want), want)
				return
			}
			seen[want] = true
		}

		// Invalid input: the field and what is wrong with it are data.
		_, err := api.Inspect(ctx, &lockdv1.InspectRequest{})
		check("Inspect with an empty key", err, wireerr.ReasonInvalidArgument)
		want := wireerr.Violation{Field: "key", Description: "key is empty"}
		if v, ok := wireerr.FieldViolation(status.Convert(err)); !ok || v != want || status.Convert(err).Message() != want.Message() {
			t.Errorf("Inspect with an empty key: violation %+v (present %v), message %q; want %+v, %q",
				v, ok, status.Convert(err).Message(), want, want.Message())
		}

		// The store's classes.
		for _, tc := range []struct {
			err    error
			reason string
		}{
			{store.ErrSessionDead, wireerr.ReasonSessionDead},
			{store.ErrNotOwner, wireerr.ReasonNotOwner},
			{store.ErrContention, wireerr.ReasonContention},
			{store.ErrNotLeader, wireerr.ReasonNotLeader},
			{store.ErrUnavailable, wireerr.ReasonUnavailable},
			{&store.DeadlockError{Keys: []string{"k"}}, wireerr.ReasonDeadlock},
			{errors.New("boom"), wireerr.ReasonInternal},
		} {
			faulty.Fail("inspect", tc.err)
			_, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: "k"})
			check("Inspect failing with "+tc.err.Error(), err, tc.reason)
		}
		faulty.Fail("inspect", nil)

		// An Acquire's own wait timeout.
		holder, waiter := openRaw(t, ctx, api, longTTL), openRaw(t, ctx, api, longTTL)
		if r, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: holder.SessionId, Key: "held"}); err != nil || !r.Granted {
			t.Fatalf("Acquire(held) by the holder = %v, %v; want granted", r, err)
		}
		_, err = api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: waiter.SessionId, Key: "held", Wait: true, WaitTimeoutMs: 100})
		check("Acquire(held) with a 100ms wait timeout", err, wireerr.ReasonWaitTimeout)
		// A request of another kind than the key's holder (C2 #ct2-multi).
		_, err = api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: waiter.SessionId, Key: "held", Wait: true, Limit: 3})
		check("Acquire(held) as a semaphore of 3", err, wireerr.ReasonLimitMismatch)

		// Access control (C2 #ct2-wire-auth): a second server with a
		// policy that gives the anonymous caller nothing.
		az, _ := authFiles(t, "rules: []\n", "someone")
		guarded := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true, Auth: az})
		gapi := dial(t, guarded.Addr)
		_, err = gapi.Inspect(ctx, &lockdv1.InspectRequest{Key: "k"})
		check("Inspect without access", err, wireerr.ReasonAccessDenied)
		_, err = gapi.Inspect(as(ctx, "nobody-known"), &lockdv1.InspectRequest{Key: "k"})
		check("Inspect with an unknown token", err, wireerr.ReasonUnauthenticated)
		// Refusals of a session's secret (C2 #ct2-ownership).
		bare := dialBare(t, srv.Addr)
		_, err = bare.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: holder.SessionId, Key: "other"})
		check("Acquire without the session's secret", err, wireerr.ReasonSessionSecretRequired)
		_, err = bare.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: holder.SessionId, Key: "other", SessionSecret: make([]byte, 32)})
		check("Acquire with another secret", err, wireerr.ReasonSessionSecretMismatch)
		// A session bound to its opener's principal (C2 #ct2-ownership).
		baz, _ := authFiles(t, principalPolicy, "alice", "bob")
		bound := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true, Auth: baz})
		bapi := dialBare(t, bound.Addr)
		alices := openRaw(t, as(ctx, "alice"), bapi, longTTL)
		_, err = bapi.Acquire(as(ctx, "bob"), &lockdv1.AcquireRequest{SessionId: alices.SessionId, SessionSecret: alices.SessionSecret, Key: "k"})
		check("Acquire in another principal's session", err, wireerr.ReasonSessionPrincipalMismatch)

		// A server limit: a KeepAlive client that does not read its replies
		// has its stream ended. Small static windows make the server's
		// sends block after 64 KiB; requests with request id 0 are
		// answered at once, without the store.
		conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
		if err != nil {
			t.Fatalf("grpc.NewClient(%s): %v", srv.Addr, err)
		}
		t.Cleanup(func() { conn.Close() })
		ka, err := lockdv1.NewLockServiceClient(conn).KeepAlive(ctx)
		if err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		for i := 0; i < 100_000; i++ {
			if ka.Send(&lockdv1.KeepAliveRequest{SessionId: "s"}) != nil {
				break // the server ended the stream
			}
		}
		for err = nil; err == nil; _, err = ka.Recv() {
		}
		check("KeepAlive that does not read its replies", err, wireerr.ReasonLimit)

		// Shutdown ends a watch.
		w, err := api.Watch(ctx, &lockdv1.WatchRequest{Prefix: "w/"})
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		if _, err := w.Header(); err != nil {
			t.Fatalf("Watch: waiting for the headers: %v", err)
		}
		stopped := make(chan error, 1)
		go func() { stopped <- srv.Stop() }() // exits when the server has stopped
		_, err = w.Recv()
		check("Watch while the server shuts down", err, wireerr.ReasonShuttingDown)
		if err := <-stopped; err != nil {
			t.Errorf("Stop: %v", err)
		}

		for _, r := range wireerr.Reasons() {
			if !seen[r] {
				t.Errorf("the server never sent reason %s", r)
			}
		}
	})
}
