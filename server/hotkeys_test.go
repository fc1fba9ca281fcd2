package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// TestHotKeys: a key waited for ranks in all three rankings of HotKeys,
// through the Go SDK and GET /v1/hotkeys, on each backend (C2
// #ct2-hotkeys); a key under another prefix is left out by the prefix.
func TestHotKeys(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		cfg := lockdtest.Config()
		cfg.HTTPListen = "127.0.0.1:0"
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Config: &cfg})
		ctx := testCtx(t, 60*time.Second)
		a, err := srv.Client.NewSession(ctx, client.WithSessionTTL(longTTL))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close(ctx)
		b, err := srv.Client.NewSession(ctx, client.WithSessionTTL(longTTL))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close(ctx)
		first, err := a.Acquire(ctx, "hot/1")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Acquire(ctx, "cold/1"); err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := b.Acquire(ctx, "hot/1")
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
		testkit.Eventually(t, 20*time.Second, "the second Acquire waits", func() error {
			hk, err := srv.Client.HotKeys(ctx, "hot/", 0)
			if err != nil {
				return err
			}
			// At least 1: the SDK may ask again while it waits.
			if len(hk.ByContention) != 1 || hk.ByContention[0].Key != "hot/1" || hk.ByContention[0].Score < 1 {
				return fmt.Errorf("by contention %v; want hot/1 scoring at least 1", hk.ByContention)
			}
			return nil
		})
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("the waiting Acquire: %v", err)
		}
		testkit.Eventually(t, 20*time.Second, "both holds of hot/1 end", func() error {
			hk, err := srv.Client.HotKeys(ctx, "hot/", 0)
			if err != nil {
				return err
			}
			if !hk.Enabled || hk.Window != time.Minute || len(hk.ByWait) != 1 || hk.ByWait[0].Key != "hot/1" ||
				len(hk.ByHold) != 1 || hk.ByHold[0].Key != "hot/1" {
				return fmt.Errorf("%+v; want hot/1 alone by wait and by hold", hk)
			}
			return nil
		})
		hc := newJClient(t, "http://"+srv.HTTPAddr, nil)
		out := hc.ok("GET", "/v1/hotkeys?limit=5", nil)
		keys := map[string]bool{}
		for _, e := range out["by_wait"].([]any) {
			keys[e.(map[string]any)["key"].(string)] = true
		}
		if !keys["hot/1"] || !keys["cold/1"] || out["enabled"] != true {
			t.Errorf("GET /v1/hotkeys = %v; want hot/1 and cold/1 by wait, enabled", out)
		}
		api := dial(t, srv.Addr)
		if _, err := api.HotKeys(ctx, &lockdv1.HotKeysRequest{Limit: 51}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("HotKeys with limit 51: %v; want INVALID_ARGUMENT", err)
		}
	})
}

// TestHotKeysAccess: under a policy each principal sees only the hot keys
// it may read, whoever made them hot (C2 #ct2-hotkeys); the control: the
// other principal's keys are in the sketch (their owner sees them), and a
// principal with no read under a prefix is refused.
func TestHotKeysAccess(t *testing.T) {
	az, _ := authFiles(t, `
rules:
  - name: alice
    principals: [alice]
    prefixes: ["a/"]
    allow: [read, lock]
  - name: bob
    principals: [bob]
    prefixes: ["b/"]
    allow: [read, lock]
`, "alice", "bob")
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{NoClient: true, Auth: az})
	ctx := testCtx(t, 30*time.Second)
	api := dial(t, srv.Addr)
	for p, key := range map[string]string{"alice": "a/secret", "bob": "b/secret"} {
		sess, err := api.OpenSession(as(ctx, p), &lockdv1.OpenSessionRequest{TtlMs: 10_000})
		if err != nil {
			t.Fatalf("%s's OpenSession: %v", p, err)
		}
		if _, err := api.Acquire(as(ctx, p), &lockdv1.AcquireRequest{SessionId: sess.SessionId, Key: key}); err != nil {
			t.Fatalf("%s's Acquire: %v", p, err)
		}
	}
	seen := func(ctx context.Context, prefix string) (map[string]bool, error) {
		r, err := api.HotKeys(ctx, &lockdv1.HotKeysRequest{Prefix: prefix})
		if err != nil {
			return nil, err
		}
		m := map[string]bool{}
		for _, e := range r.ByWait {
			m[e.Key] = true
		}
		return m, nil
	}
	for p, c := range map[string]struct{ mine, theirs string }{"alice": {"a/secret", "b/secret"}, "bob": {"b/secret", "a/secret"}} {
		m, err := seen(as(ctx, p), "")
		if err != nil {
			t.Fatalf("%s's HotKeys: %v", p, err)
		}
		if !m[c.mine] || m[c.theirs] || len(m) != 1 {
			t.Errorf("%s sees %v; want %s only", p, m, c.mine)
		}
	}
	if _, err := seen(as(ctx, "alice"), "b/"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("alice's HotKeys under b/: %v; want PERMISSION_DENIED", err)
	}
}
