package server_test

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/store"
)

// TestCheckToken is C2 #ct2-check-token on both backends, over gRPC and
// HTTP: the holder's token is current in both modes; after a release and a
// re-grant the old token is stale in both (the cached mode within its
// watch delay: polled) and the new one current; a key nobody holds is not
// current; token 0 and an unknown consistency are INVALID_ARGUMENT; a
// second cached check of an unchanged key is answered from the index.
func TestCheckToken(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := startHTTP(t, backend, lockdtest.Options{})
		api := dial(t, srv.Addr)
		ctx := testCtx(t, time.Minute)
		lin := lockdv1.CheckConsistency_CHECK_CONSISTENCY_LINEARIZABLE
		cached := lockdv1.CheckConsistency_CHECK_CONSISTENCY_CACHED
		check := func(key string, token uint64, mode lockdv1.CheckConsistency) *lockdv1.CheckTokenResponse {
			t.Helper()
			r, err := api.CheckToken(ctx, &lockdv1.CheckTokenRequest{Key: key, Token: token, Consistency: mode})
			if err != nil {
				t.Fatalf("CheckToken(%s, %d, %v): %v", key, token, mode, err)
			}
			return r
		}

		a := openRaw(t, ctx, api, longTTL)
		g1, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: a.SessionId, Key: "fence/k"})
		if err != nil || !g1.Granted {
			t.Fatalf("Acquire = %v, %v", g1, err)
		}
		for _, mode := range []lockdv1.CheckConsistency{lockdv1.CheckConsistency_CHECK_CONSISTENCY_UNSPECIFIED, lin, cached} {
			if r := check("fence/k", g1.Token, mode); !r.Current || !slices.Equal(r.Tokens, []uint64{g1.Token}) {
				t.Fatalf("CheckToken(holder's token, %v) = %v; want current, tokens [%d]", mode, r, g1.Token)
			}
		}
		// The first cached check read the key; the next one is the index's.
		testkit.Eventually(t, 10*time.Second, "a cached answer from the index", func() bool {
			r := check("fence/k", g1.Token, cached)
			return r.Current && r.Cached
		})
		if r := check("fence/k", g1.Token, lin); r.Cached {
			t.Fatalf("linearizable CheckToken answered cached: %v", r)
		}

		// Release and re-grant to another session: the old token is stale.
		if _, err := api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: a.SessionId, Key: "fence/k", Token: g1.Token}); err != nil {
			t.Fatalf("Release: %v", err)
		}
		b := openRaw(t, ctx, api, longTTL)
		g2, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: b.SessionId, Key: "fence/k"})
		if err != nil || !g2.Granted || g2.Token <= g1.Token {
			t.Fatalf("re-grant = %v, %v; want a token above %d", g2, err, g1.Token)
		}
		if r := check("fence/k", g1.Token, lin); r.Current || !slices.Equal(r.Tokens, []uint64{g2.Token}) {
			t.Fatalf("CheckToken(old token) after a re-grant = %v; want stale, tokens [%d]", r, g2.Token)
		}
		testkit.Eventually(t, 10*time.Second, "the cached mode sees the re-grant", func() bool {
			old, cur := check("fence/k", g1.Token, cached), check("fence/k", g2.Token, cached)
			return !old.Current && cur.Current
		})

		// A key nobody holds: not current, no tokens, no error.
		for _, mode := range []lockdv1.CheckConsistency{lin, cached} {
			if r := check("fence/never-used", 42, mode); r.Current || len(r.Tokens) != 0 {
				t.Fatalf("CheckToken(unknown key, %v) = %v; want not current, no tokens", mode, r)
			}
		}
		// Bad input.
		for _, req := range []*lockdv1.CheckTokenRequest{{Key: "fence/k"}, {Key: "", Token: 1}, {Key: "fence/k", Token: 1, Consistency: 7}} {
			if _, err := api.CheckToken(ctx, req); status.Code(err) != codes.InvalidArgument || reason(err) != wireerr.ReasonInvalidArgument {
				t.Fatalf("CheckToken(%v) = %v; want INVALID_ARGUMENT", req, err)
			}
		}

		// HTTP: GET /v1/tokens/{key}?token=T.
		hc := newJClient(t, "http://"+srv.HTTPAddr, nil)
		out := hc.ok("GET", fmt.Sprintf("/v1/tokens/fence/k?token=%d", g2.Token), nil)
		if out["current"] != true {
			t.Fatalf("GET /v1/tokens (current token) = %v; want current", out)
		}
		out = hc.ok("GET", fmt.Sprintf("/v1/tokens/fence/k?token=%d&consistency=CHECK_CONSISTENCY_CACHED", g1.Token), nil)
		if out["current"] != false {
			t.Fatalf("GET /v1/tokens (stale token, cached) = %v; want not current", out)
		}
		st, out := hc.do("GET", "/v1/tokens/fence/k?token=0", nil)
		wantErr(t, "GET /v1/tokens (token 0)", st, out, http.StatusBadRequest, wireerr.ReasonInvalidArgument)
		// A key ending in ":check" is still inspected by GET /v1/locks/{key}.
		if out := hc.ok("GET", "/v1/locks/fence/x:check", nil); out["held"] != false {
			t.Fatalf("GET /v1/locks/fence/x:check = %v; want Inspect's answer", out)
		}
	})
}

// TestCheckTokenCachedNeedsWatch: the cached mode never answers from an
// index whose watch is not running (C2 #ct2-check-token): while the
// server's lock-loss watch cannot be established every cached check reads
// the backend (cached false, still correct); once the watch is up, a key
// checked again is answered from the index.
func TestCheckTokenCachedNeedsWatch(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		var faulty *lockdtest.Faulty
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true, Wrap: func(st store.LockStore) store.LockStore {
			faulty = lockdtest.NewFaulty(st)
			faulty.Fail(telemetry.OpWatch, store.ErrUnavailable)
			return faulty
		}})
		api := dial(t, srv.Addr)
		ctx := testCtx(t, time.Minute)
		a := openRaw(t, ctx, api, longTTL)
		g, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: a.SessionId, Key: "fence/w"})
		if err != nil || !g.Granted {
			t.Fatalf("Acquire = %v, %v", g, err)
		}
		cached := &lockdv1.CheckTokenRequest{Key: "fence/w", Token: g.Token, Consistency: lockdv1.CheckConsistency_CHECK_CONSISTENCY_CACHED}
		for i := range 3 {
			r, err := api.CheckToken(ctx, cached)
			if err != nil || !r.Current || r.Cached {
				t.Fatalf("cached check %d with no watch = %v, %v; want current, read from the backend", i, r, err)
			}
		}
		faulty.Fail(telemetry.OpWatch, nil)
		testkit.Eventually(t, 20*time.Second, "a cached answer once the watch is up", func() bool {
			r, err := api.CheckToken(ctx, cached)
			return err == nil && r.Current && r.Cached
		})
	})
}
