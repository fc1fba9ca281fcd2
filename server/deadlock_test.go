package server_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// TestDeadlockOnTheWire: a wait that closes a cycle (C2 #ct2-deadlock) is
// DEADLOCK with code ABORTED over gRPC and 409 over HTTP, the cycle's keys
// as JSON in the ErrorInfo metadata "keys"; the other wait is granted once
// the refused session releases.
func TestDeadlockOnTheWire(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := startHTTP(t, backend, lockdtest.Options{})
		ctx := testCtx(t, 60*time.Second)
		api := dial(t, srv.Addr)
		hc := newJClient(t, "http://"+srv.HTTPAddr, nil)
		for _, overHTTP := range []bool{false, true} {
			a, b := openRaw(t, ctx, api, longTTL), openRaw(t, ctx, api, longTTL)
			ka, kb := "dlw/a", "dlw/b"
			if overHTTP {
				ka, kb = "dlh/a", "dlh/b"
			}
			gb, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: b.SessionId, SessionSecret: b.SessionSecret, Key: kb})
			if err != nil || !gb.Granted {
				t.Fatalf("Acquire(%s) = %v, %v", kb, gb, err)
			}
			if r, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: a.SessionId, SessionSecret: a.SessionSecret, Key: ka}); err != nil || !r.Granted {
				t.Fatalf("Acquire(%s) = %v, %v", ka, r, err)
			}
			type result struct {
				r   *lockdv1.AcquireResponse
				err error
			}
			aw := make(chan result, 1)
			go func() { // ends with the wait: granted below, or ctx
				r, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: a.SessionId, SessionSecret: a.SessionSecret, Key: kb, Wait: true})
				aw <- result{r, err}
			}()
			waitQueued(t, ctx, api, "a", kb)
			keys, _, _ := closeCycle(t, ctx, api, hc, overHTTP, b, ka)
			if !slices.Equal(keys, []string{ka, kb}) {
				t.Fatalf("over HTTP %v: keys %v; want [%s %s]", overHTTP, keys, ka, kb)
			}
			if _, err := api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: b.SessionId, SessionSecret: b.SessionSecret, Key: kb, Token: gb.Token}); err != nil {
				t.Fatal(err)
			}
			if r := <-aw; r.err != nil || !r.r.Granted {
				t.Fatalf("a's wait after b released: %v, %v; want granted", r.r, r.err)
			}
		}
	})
}

// waitQueued waits until key has one waiter (who's wait), read with ctx's caller.
func waitQueued(t *testing.T, ctx context.Context, api lockdv1.LockServiceClient, who, key string) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, who+" queued for "+key, func() error {
		r, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: key})
		if err != nil || len(r.GetLock().GetWaiters()) != 1 {
			return status.Errorf(codes.Unknown, "waiters %v, %v", r.GetLock().GetWaiters(), err)
		}
		return nil
	})
}

// closeCycle has session s wait for key, closing a cycle of waiting
// sessions, over HTTP (hc, with its token) or gRPC (ctx's caller); the wait
// must be refused with DEADLOCK (409 / ABORTED). It returns the keys of the
// refusal's details, its message and its whole body (the JSON answer, or
// every gRPC detail decoded).
func closeCycle(t *testing.T, ctx context.Context, api lockdv1.LockServiceClient, hc *jclient, overHTTP bool,
	s *lockdv1.OpenSessionResponse, key string) (keys []string, msg, body string) {
	t.Helper()
	if !overHTTP {
		_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: s.SessionId, SessionSecret: s.SessionSecret, Key: key, Wait: true})
		st := status.Convert(err)
		if st.Code() != codes.Aborted || wireerr.Reason(st) != wireerr.ReasonDeadlock {
			t.Fatalf("gRPC acquire closing the cycle = %v; want ABORTED, DEADLOCK", err)
		}
		keys, _ = wireerr.DeadlockKeys(st)
		return keys, st.Message(), fmt.Sprint(st.Details()...)
	}
	st, out := hc.do("POST", "/v1/locks/"+key+":acquire", obj{"session_id": s.SessionId,
		"session_secret": base64.StdEncoding.EncodeToString(s.SessionSecret), "wait": true})
	wantErr(t, "HTTP acquire closing the cycle", st, out, http.StatusConflict, wireerr.ReasonDeadlock)
	b, _ := json.Marshal(out)
	msg, _ = out["message"].(string)
	details, _ := out["details"].([]any)
	for _, d := range details {
		if m, _ := d.(obj); m["reason"] == wireerr.ReasonDeadlock {
			md, _ := m["metadata"].(obj)
			k, _ := md[wireerr.MetadataKeys].(string)
			if err := json.Unmarshal([]byte(k), &keys); err != nil {
				t.Fatalf("metadata keys %q: %v", k, err)
			}
		}
	}
	return keys, msg, string(b)
}
