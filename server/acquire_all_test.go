package server_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// TestAcquireAll: an Acquire with keys grants every key, each with its own
// token, in the order asked, or none (C2 #ct2-acquire-all); a try of a set
// with a held key answers not granted and holds nothing; a wait that times
// out leaves nothing; the one-key fields are refused with keys.
func TestAcquireAll(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true})
		ctx := testCtx(t, 60*time.Second)
		api := dial(t, srv.Addr)
		a := openRaw(t, ctx, api, longTTL).SessionId
		b := openRaw(t, ctx, api, longTTL).SessionId

		keys := []string{"all/b", "all/a", "all/c"}
		ga, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: a, Keys: keys, Wait: true})
		if err != nil || !ga.Granted || len(ga.Grants) != 3 || ga.RemainingMs <= 0 || ga.Key != "" || ga.Token != 0 {
			t.Fatalf("Acquire(a, keys) = %v, %v; want 3 grants with remaining", ga, err)
		}
		for i, g := range ga.Grants {
			info, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: keys[i]})
			if g.Key != keys[i] || g.Token == 0 || err != nil || info.Lock.GetSessionId() != a || info.Lock.GetToken() != g.Token {
				t.Fatalf("grant %d = %v; Inspect(%s) = %v, %v; want a's grant of %s", i, g, keys[i], info, err, keys[i])
			}
		}
		try, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: b, Keys: []string{"all/0", "all/c"}})
		if err != nil || try.Granted || len(try.Grants) != 0 {
			t.Fatalf("try Acquire(b, all/0 all/c) = %v, %v; want granted=false", try, err)
		}
		_, err = api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: b, Keys: []string{"all/0", "all/c"}, Wait: true, WaitTimeoutMs: 300})
		if status.Code(err) != codes.DeadlineExceeded || reason(err) != wireerr.ReasonWaitTimeout {
			t.Fatalf("Acquire(b, wait 300ms) = %v (reason %q); want WAIT_TIMEOUT", err, reason(err))
		}
		if info, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: "all/0"}); err != nil || info.Held {
			t.Fatalf("Inspect(all/0) after b's failed calls = %v, %v; want free", info, err)
		}
		for _, g := range ga.Grants {
			if _, err := api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: a, Key: g.Key, Token: g.Token}); err != nil {
				t.Fatalf("Release(%s): %v", g.Key, err)
			}
		}
		gb, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: b, Keys: []string{"all/0", "all/c"}})
		if err != nil || !gb.Granted || len(gb.Grants) != 2 || gb.Grants[1].Token <= ga.Grants[2].Token {
			t.Fatalf("try Acquire(b) after the release = %v, %v; want granted, all/c's token above %d", gb, err, ga.Grants[2].Token)
		}

		for _, tc := range []struct {
			field string
			req   *lockdv1.AcquireRequest
		}{
			{"key", &lockdv1.AcquireRequest{Key: "k"}},
			{"keys", &lockdv1.AcquireRequest{Keys: []string{"x", "x"}}},
			{"keys", &lockdv1.AcquireRequest{Keys: []string{"x", ""}}},
			{"keys", &lockdv1.AcquireRequest{Keys: strings.Split(strings.Repeat("k,", 64)+"k", ",")}},
			{"limit", &lockdv1.AcquireRequest{Limit: 3}},
			{"mode", &lockdv1.AcquireRequest{Mode: lockdv1.LockMode_LOCK_MODE_SHARED}},
			{"keep_place", &lockdv1.AcquireRequest{KeepPlace: true, Wait: true}},
			{"value", &lockdv1.AcquireRequest{Value: []byte("v")}},
			{"lock_delay_ms", &lockdv1.AcquireRequest{LockDelayMs: 1000}},
			{"max_hold_ms", &lockdv1.AcquireRequest{MaxHoldMs: 1000}},
		} {
			tc.req.SessionId = a
			if tc.req.Keys == nil {
				tc.req.Keys = []string{"all/x", "all/y"}
			}
			_, err := api.Acquire(ctx, tc.req)
			if got := badField(err); status.Code(err) != codes.InvalidArgument || got != tc.field {
				t.Errorf("Acquire with keys and %s = %v (field %q); want INVALID_ARGUMENT naming %s", tc.field, err, got, tc.field)
			}
		}
		if info, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: "all/x"}); err != nil || info.Held {
			t.Fatalf("Inspect(all/x) after refused calls = %v, %v; want free", info, err)
		}
	})
}

// badField is the field a BadRequest detail of err names ("" if none).
func badField(err error) string {
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.FieldViolations) > 0 {
			return br.FieldViolations[0].Field
		}
	}
	return ""
}

// TestAcquireAllAuthorisesEveryKey: lock is checked on every key of a
// multi-key Acquire; one key outside the caller's rule refuses the whole
// call with ACCESS_DENIED naming it, and nothing is held.
func TestAcquireAllAuthorisesEveryKey(t *testing.T) {
	az, _ := authFiles(t, matrixPolicy, "root", "locker")
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{Auth: az, NoClient: true})
	api := dial(t, srv.Addr)
	ctx := as(testCtx(t, time.Minute), "locker")
	sid := openRaw(t, ctx, api, longTTL).SessionId
	for _, keys := range [][]string{{"a/1", "ab/2"}, {"ab/2", "a/1"}, {"a/1", "a/2", "b/3"}} {
		_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Keys: keys, Wait: true})
		if status.Code(err) != codes.PermissionDenied || reason(err) != wireerr.ReasonAccessDenied {
			t.Fatalf("locker Acquire(%q) = %v; want PERMISSION_DENIED ACCESS_DENIED", keys, err)
		}
		bad := keys[len(keys)-1]
		if keys[0] == "ab/2" {
			bad = "ab/2"
		}
		if msg := status.Convert(err).Message(); !strings.Contains(msg, bad) {
			t.Errorf("refusal %q does not name the key %q", msg, bad)
		}
	}
	root := as(testCtx(t, time.Minute), "root")
	for _, k := range []string{"a/1", "a/2"} {
		if info, err := api.Inspect(root, &lockdv1.InspectRequest{Key: k}); err != nil || info.Held {
			t.Fatalf("Inspect(%s) after refused calls = %v, %v; want free", k, info, err)
		}
	}
	// The control: every key under a/ is allowed.
	r, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Keys: []string{"a/2", "a/1"}, Wait: true})
	if err != nil || !r.Granted || len(r.Grants) != 2 {
		t.Fatalf("locker Acquire(a/2, a/1) = %v, %v; want granted", r, err)
	}
}
