package server_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// matrixPolicy gives each action to one principal on the prefix "a/"; root
// may do everything everywhere (to set up the state the matrix needs);
// nobody has no rule.
const matrixPolicy = `
rules:
  - name: root
    principals: [root]
    prefixes: ["*"]
    allow: [read, lock, admin]
  - name: readers
    principals: [reader]
    prefixes: ["a/"]
    allow: [read]
  - name: lockers
    principals: [locker]
    prefixes: ["a/"]
    allow: [lock]
  - name: admins
    principals: [admin]
    prefixes: ["a/"]
    allow: [admin]
`

// authFiles writes a policy and a tokens file giving principal p the token
// "token-"+p, and returns an Authorizer over them (closed by the test).
func authFiles(t *testing.T, policy string, principals ...string) (*auth.Authorizer, string) {
	t.Helper()
	dir := t.TempDir()
	pf, tf := filepath.Join(dir, "policy.yaml"), filepath.Join(dir, "tokens")
	var tokens strings.Builder
	for _, p := range principals {
		fmt.Fprintf(&tokens, "%s %s\n", auth.HashToken("token-"+p), p)
	}
	if err := os.WriteFile(pf, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tf, []byte(tokens.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	az, err := auth.New(auth.Config{PolicyFile: pf, TokensFile: tf}, auth.Options{ReloadInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("auth.New: %v", err)
	}
	t.Cleanup(func() { _ = az.Close() })
	return az, pf
}

// as returns ctx calling as principal p (its bearer token).
func as(ctx context.Context, p string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, auth.AuthorizationHeader, "Bearer token-"+p)
}

// TestPolicyMatrix: every RPC × {read, lock, admin, no rule} × {a key or
// prefix the rule covers (a/…), a sibling it must not cover (ab…)} gives
// the documented decision (C5 #ct5-auth): allowed iff the principal's one
// action is the RPC's and the key is under a/; the session calls
// (OpenSession, KeepAlive, CloseSession) and ListSessions, which name no key, iff the
// principal has lock on some key. Denials are PERMISSION_DENIED
// ACCESS_DENIED; allowed calls reach the handler.
func TestPolicyMatrix(t *testing.T) {
	az, _ := authFiles(t, matrixPolicy, "root", "reader", "locker", "admin", "nobody")
	log, logs := testkit.NewLogger()
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{Auth: az, NoClient: true, Logger: log})
	api := dial(t, srv.Addr)
	ctx := testCtx(t, 2*time.Minute)
	root := as(ctx, "root")
	rootSID := openRaw(t, root, api, longTTL).SessionId
	for _, k := range []string{"a/held", "ab/held"} {
		if r, err := api.Acquire(root, &lockdv1.AcquireRequest{SessionId: rootSID, Key: k}); err != nil || !r.Granted {
			t.Fatalf("root Acquire(%s) = %v, %v", k, r, err)
		}
	}

	// Acquire and Release act in a session of locker's own: a session is
	// bound to the principal that opened it (C2 #ct2-ownership), and the
	// other principals are refused by the policy before their session
	// is looked at.
	lockerSID := openRaw(t, as(ctx, "locker"), api, longTTL).SessionId

	type rpc struct {
		name   string
		action string // "" for the session calls
		// call makes the RPC as ctx's principal on the key (or prefix)
		// under top ("a/" or "ab"); an allowed call must return nil.
		call func(ctx context.Context, top, id string) error
	}
	key := func(top, id string) string { return strings.TrimSuffix(top, "/") + "/" + id }
	rpcs := []rpc{
		{"OpenSession", "", func(ctx context.Context, _, _ string) error {
			_, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: longTTL.Milliseconds()})
			return err
		}},
		{"KeepAlive", "", func(ctx context.Context, _, _ string) error {
			ka, err := api.KeepAlive(ctx)
			if err != nil {
				return err
			}
			defer ka.CloseSend()
			if err := ka.Send(&lockdv1.KeepAliveRequest{SessionId: rootSID, RequestId: 1}); err != nil && err != io.EOF {
				return err
			}
			_, err = ka.Recv()
			return err
		}},
		{"CloseSession", "", func(ctx context.Context, _, id string) error {
			_, err := api.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: "unknown-" + id})
			return err
		}},
		{"Acquire", "lock", func(ctx context.Context, top, id string) error {
			r, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: lockerSID, Key: key(top, id)})
			if err == nil && !r.Granted {
				return fmt.Errorf("not granted")
			}
			return err
		}},
		{"Release", "lock", func(ctx context.Context, top, _ string) error {
			// A stale token: the handler answers NOT_OWNER, which
			// shows the call passed access control.
			_, err := api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: lockerSID, Key: key(top, "held"), Token: 1})
			if reason(err) == wireerr.ReasonNotOwner {
				return nil
			}
			return err
		}},
		{"SetValue", "lock", func(ctx context.Context, top, _ string) error {
			// As Release: NOT_OWNER shows the call passed access control.
			_, err := api.SetValue(ctx, &lockdv1.SetValueRequest{SessionId: lockerSID, Key: key(top, "held"), Token: 1, Value: []byte("v")})
			if reason(err) == wireerr.ReasonNotOwner {
				return nil
			}
			return err
		}},
		{"Inspect", "read", func(ctx context.Context, top, _ string) error {
			r, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: key(top, "held")})
			if err == nil && !r.Held {
				return fmt.Errorf("not held")
			}
			return err
		}},
		{"CheckToken", "read", func(ctx context.Context, top, _ string) error {
			// Token 1 is no grant's: answered not current, which shows
			// the call passed access control.
			_, err := api.CheckToken(ctx, &lockdv1.CheckTokenRequest{Key: key(top, "held"), Token: 1})
			return err
		}},
		{"List", "read", func(ctx context.Context, top, _ string) error {
			r, err := api.List(ctx, &lockdv1.ListRequest{Prefix: top})
			if err == nil && len(r.Locks) == 0 {
				return fmt.Errorf("nothing listed")
			}
			return err
		}},
		{"Watch", "read", func(ctx context.Context, top, _ string) error {
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			w, err := api.Watch(wctx, &lockdv1.WatchRequest{Prefix: top})
			if err != nil {
				return err
			}
			if _, err := w.Header(); err != nil {
				return err
			}
			// A denied watch ends with its status; an allowed one is
			// established (headers with no trailer yet).
			if tr := w.Trailer(); len(tr) > 0 {
				_, err = w.Recv()
				return err
			}
			return nil
		}},
		{"ListSessions", "", func(ctx context.Context, _, _ string) error {
			// Own sessions need lock on some key (admin on every key
			// lists all: root, TestListSessions).
			_, err := api.ListSessions(ctx, &lockdv1.ListSessionsRequest{})
			return err
		}},
		{"Revoke", "admin", func(ctx context.Context, top, id string) error {
			_, err := api.Revoke(ctx, &lockdv1.RevokeRequest{Key: key(top, "free-"+id)})
			return err
		}},
	}
	principals := map[string]string{"read": "reader", "lock": "locker", "admin": "admin", "none": "nobody"}
	n := 0
	for _, r := range rpcs {
		for _, action := range []string{"read", "lock", "admin", "none"} {
			for _, top := range []string{"a/", "ab"} {
				p := principals[action]
				var want bool
				if r.action == "" {
					want = action == "lock"
				} else {
					want = action == r.action && top == "a/"
				}
				n++
				id := fmt.Sprintf("%s-%s-%d", r.name, p, n)
				err := r.call(as(ctx, p), top, id)
				switch {
				case want && err != nil:
					t.Errorf("%s as %s (%s) on %s: %v; want allowed", r.name, p, action, top, err)
				case !want && (status.Code(err) != codes.PermissionDenied || reason(err) != wireerr.ReasonAccessDenied):
					t.Errorf("%s as %s (%s) on %s: %v; want PERMISSION_DENIED %s", r.name, p, action, top, err, wireerr.ReasonAccessDenied)
				}
			}
		}
	}

	// Anonymous callers have no rule either; an unknown token is refused
	// as such, never treated as anonymous.
	if _, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: "a/held"}); reason(err) != wireerr.ReasonAccessDenied {
		t.Errorf("anonymous Inspect: %v; want %s", err, wireerr.ReasonAccessDenied)
	}
	bad := metadata.AppendToOutgoingContext(ctx, auth.AuthorizationHeader, "Bearer not-a-token")
	if _, err := api.Inspect(bad, &lockdv1.InspectRequest{Key: "a/held"}); status.Code(err) != codes.Unauthenticated || reason(err) != wireerr.ReasonUnauthenticated {
		t.Errorf("Inspect with an unknown token: %v; want UNAUTHENTICATED %s", err, wireerr.ReasonUnauthenticated)
	}

	// The audit trail: denials are logged and counted without principals in
	// labels; a revoke carries by and rule.
	denied := logs.Events("auth_denied")
	if len(denied) == 0 {
		t.Fatal("no auth_denied event")
	}
	found := false
	for _, ev := range denied {
		if ev["by"] == "reader" && ev["method"] == "Acquire" && strings.HasPrefix(fmt.Sprint(ev["key"]), "a/Acquire-reader-") && ev["rule"] == auth.RuleDefaultDeny && ev["reason"] == "access_denied" {
			found = true
		}
	}
	if !found {
		t.Errorf("no auth_denied {by reader, method Acquire, key a/…, rule default-deny, reason access_denied} in %v", denied)
	}
	if got := counter(t, srv.Registry, "lockd_auth_denied_total", map[string]string{"method": "Acquire", "reason": "access_denied"}); got != 7 {
		t.Errorf("lockd_auth_denied_total{Acquire, access_denied} = %v; want 7 (8 combinations, locker on a/ allowed)", got)
	}
	if got := counter(t, srv.Registry, "lockd_auth_denied_total", map[string]string{"method": "Inspect", "reason": "unauthenticated"}); got != 1 {
		t.Errorf("lockd_auth_denied_total{Inspect, unauthenticated} = %v; want 1", got)
	}
	if _, err := api.Revoke(as(ctx, "admin"), &lockdv1.RevokeRequest{Key: "a/held"}); err != nil {
		t.Fatalf("admin Revoke(a/held): %v", err)
	}
	testkit.Eventually(t, 5*time.Second, "lock_revoked with by and rule", func() bool {
		return slices.ContainsFunc(logs.Events("lock_revoked"), func(ev map[string]any) bool {
			return ev["key"] == "a/held" && ev["by"] == "admin" && ev["rule"] == "admins" && ev["token"] != nil
		})
	})
}

const filterPolicy = `
rules:
  - name: root
    principals: [root]
    prefixes: ["*"]
    allow: [read, lock]
  - name: team-a
    principals: [reader]
    prefixes: ["a/", "c"]
    allow: [read]
`

// TestListWatchFiltered: List and Watch over a prefix the caller may read
// only in part return exactly the readable keys; pages are full but at the
// end and page tokens never name an unreadable key.
func TestListWatchFiltered(t *testing.T) {
	az, _ := authFiles(t, filterPolicy, "root", "reader")
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{Auth: az, NoClient: true})
	api := dial(t, srv.Addr)
	ctx := testCtx(t, time.Minute)
	root, reader := as(ctx, "root"), as(ctx, "reader")
	sid := openRaw(t, root, api, longTTL).SessionId
	acquire := func(k string) {
		t.Helper()
		if r, err := api.Acquire(root, &lockdv1.AcquireRequest{SessionId: sid, Key: k}); err != nil || !r.Granted {
			t.Fatalf("Acquire(%s) = %v, %v", k, r, err)
		}
	}

	// Watch first, so it sees the acquisitions below.
	wctx, cancel := context.WithCancel(reader)
	defer cancel()
	w, err := api.Watch(wctx, &lockdv1.WatchRequest{Prefix: ""})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Header(); err != nil {
		t.Fatalf("Watch header: %v", err)
	}

	var want []string
	for i := range 5 {
		for _, k := range []string{"a/%d", "ab/%d", "b/%d", "c/%d", "cd/%d"} {
			key := fmt.Sprintf(k, i)
			acquire(key)
			if strings.HasPrefix(key, "a/") || strings.HasPrefix(key, "c/") {
				want = append(want, key)
			}
		}
	}
	acquire("c") // the rule's prefix itself
	want = append(want, "c")
	slices.Sort(want)

	for _, limit := range []int32{0, 1, 2, 3, 7} {
		var got []string
		token := ""
		for pages := 0; ; pages++ {
			r, err := api.List(reader, &lockdv1.ListRequest{Prefix: "", Limit: limit, PageToken: token})
			if err != nil {
				t.Fatalf("List(limit %d): %v", limit, err)
			}
			for _, l := range r.Locks {
				got = append(got, l.Key)
			}
			if r.NextPageToken == "" {
				break
			}
			if limit > 0 && len(r.Locks) != int(limit) {
				t.Errorf("List(limit %d): a page of %d before the end", limit, len(r.Locks))
			}
			if last := r.Locks[len(r.Locks)-1].Key; !slices.Contains(want, last) {
				t.Errorf("List(limit %d): page ends at unreadable %q", limit, last)
			}
			token = r.NextPageToken
		}
		if !slices.Equal(got, want) {
			t.Errorf("List(\"\", limit %d) as reader = %v; want %v", limit, got, want)
		}
	}
	// A prefix the reader may read entirely is not filtered; "a" overlaps
	// a/ only.
	r, err := api.List(reader, &lockdv1.ListRequest{Prefix: "a"})
	if err != nil || len(r.Locks) != 5 {
		t.Errorf("List(a) as reader = %v, %v; want the 5 keys under a/", r, err)
	}

	var seen []string
	for len(seen) < len(want) {
		ev, err := w.Recv()
		if err != nil {
			t.Fatalf("Watch Recv after %v: %v", seen, err)
		}
		seen = append(seen, ev.Key)
	}
	slices.Sort(seen)
	if !slices.Equal(seen, want) {
		t.Errorf("Watch(\"\") as reader saw %v; want %v", seen, want)
	}
	// Nothing unreadable is pending: acquire an unreadable key, then a
	// readable one, and expect exactly the readable one next.
	acquire("b/late")
	acquire("a/late")
	ev, err := w.Recv()
	if err != nil || ev.Key != "a/late" {
		t.Errorf("Watch next event = %v, %v; want a/late (b/late filtered)", ev, err)
	}
}

// TestMalformedReloadKeepsPolicy: a policy file that stops parsing is
// refused (auth_reload_failed names the line) and the server keeps
// deciding by the old policy; a fixed file takes effect.
func TestMalformedReloadKeepsPolicy(t *testing.T) {
	dir := t.TempDir()
	pf := filepath.Join(dir, "policy.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(pf+".tmp", []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(pf+".tmp", pf); err != nil {
			t.Fatal(err)
		}
	}
	write("rules:\n  - name: old\n    principals: [anonymous]\n    prefixes: [x/]\n    allow: [read]\n")
	log, logs := testkit.NewLogger()
	az, err := auth.New(auth.Config{PolicyFile: pf}, auth.Options{Logger: log, ReloadInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = az.Close() })
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{Auth: az, NoClient: true, Logger: log})
	api := dial(t, srv.Addr)
	ctx := testCtx(t, time.Minute)
	inspect := func(k string) error { _, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: k}); return err }

	write("rules:\n  - name: new\n    principals: [anonymous]\n    prefixes: [y/]\n    allow: [reed]\n")
	testkit.Eventually(t, 5*time.Second, "auth_reload_failed", func() bool { return len(logs.Events("auth_reload_failed")) > 0 })
	if ev := logs.Events("auth_reload_failed")[0]; ev["line"] != float64(5) || !strings.Contains(fmt.Sprint(ev["error"]), `unknown action "reed"`) {
		t.Errorf("auth_reload_failed = %v; want line 5 and the reason", ev)
	}
	if err := inspect("x/1"); err != nil {
		t.Errorf("Inspect(x/1) under the kept policy: %v", err)
	}
	if err := inspect("y/1"); reason(err) != wireerr.ReasonAccessDenied {
		t.Errorf("Inspect(y/1) under the kept policy: %v; want %s", err, wireerr.ReasonAccessDenied)
	}

	write("rules:\n  - name: new\n    principals: [anonymous]\n    prefixes: [y/]\n    allow: [read]\n")
	testkit.Eventually(t, 5*time.Second, "the fixed policy in force", func() bool { return inspect("y/1") == nil })
	if err := inspect("x/1"); reason(err) != wireerr.ReasonAccessDenied {
		t.Errorf("Inspect(x/1) under the new policy: %v; want %s", err, wireerr.ReasonAccessDenied)
	}
}
