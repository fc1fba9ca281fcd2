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
	"lock.dev/lockd/internal/lockdtest"
	"lock.dev/lockd/internal/testkit"
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
// (OpenSession, KeepAlive, CloseSession), which name no key, iff the
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
			r, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: rootSID, Key: key(top, id)})
			if err == nil && !r.Granted {
				return fmt.Errorf("not granted")
			}
			return err
		}},
		{"Release", "lock", func(ctx context.Context, top, _ string) error {
			// A stale token: the handler answers NOT_OWNER, which
			// shows the call passed access control.
			_, err := api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: rootSID, Key: key(top, "held"), Token: 1})
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
	denied := events(logs, "auth_denied")
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
		return slices.ContainsFunc(events(logs, "lock_revoked"), func(ev map[string]any) bool {
			return ev["key"] == "a/held" && ev["by"] == "admin" && ev["rule"] == "admins" && ev["token"] != nil
		})
	})
}

// events returns the C4 events named event (the log message) in logs.
func events(logs *testkit.LogBuffer, event string) []map[string]any {
	var out []map[string]any
	for _, rec := range logs.Records() {
		if rec["msg"] == event {
			out = append(out, rec)
		}
	}
	return out
}
