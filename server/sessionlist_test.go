package server_test

import (
	"context"
	"slices"
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

const sessionsPolicy = `
rules:
  - name: root
    principals: [root]
    prefixes: ["*"]
    allow: [lock, admin]
  - name: workers
    principals: [alice, bob]
    prefixes: ["w/"]
    allow: [lock]
  - name: narrow-admin
    principals: [carol]
    prefixes: ["w/"]
    allow: [lock, admin]
  - name: anon
    principals: [anonymous]
    prefixes: ["w/"]
    allow: [lock]
`

// TestListSessions: ListSessions shows a caller its own sessions (lock on
// some key) and every session only to admin on every key (C5 #ct5-auth);
// another principal's filter, anonymous callers and unknown tokens are
// refused; the details are right (principal, owner, TTL, lock count) and
// listing keeps nothing alive: a listed session nobody heartbeats ends.
func TestListSessions(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		az, _ := authFiles(t, sessionsPolicy, "root", "alice", "bob", "carol")
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Auth: az, NoClient: true})
		api := dial(t, srv.Addr)
		ctx := testCtx(t, 2*time.Minute)
		alice, bob, root, carol := as(ctx, "alice"), as(ctx, "bob"), as(ctx, "root"), as(ctx, "carol")

		a1, err := api.OpenSession(alice, &lockdv1.OpenSessionRequest{TtlMs: longTTL.Milliseconds(), Owner: "a-worker"})
		if err != nil {
			t.Fatal(err)
		}
		a2 := openRaw(t, alice, api, longTTL)
		b1 := openRaw(t, bob, api, longTTL)
		if r, err := api.Acquire(alice, &lockdv1.AcquireRequest{SessionId: a1.SessionId, Key: "w/1"}); err != nil || !r.Granted {
			t.Fatalf("Acquire(w/1) = %v, %v", r, err)
		}
		list := func(ctx context.Context, req *lockdv1.ListSessionsRequest) ([]string, map[string]*lockdv1.SessionInfo, error) {
			t.Helper()
			var ids []string
			infos := map[string]*lockdv1.SessionInfo{}
			for {
				r, err := api.ListSessions(ctx, req)
				if err != nil {
					return nil, nil, err
				}
				for _, s := range r.Sessions {
					ids = append(ids, s.SessionId)
					infos[s.SessionId] = s
				}
				if r.NextPageToken == "" {
					return ids, infos, nil
				}
				req.PageToken = r.NextPageToken
			}
		}
		sorted := func(ids ...string) []string { slices.Sort(ids); return ids }

		ids, infos, err := list(alice, &lockdv1.ListSessionsRequest{})
		if want := sorted(a1.SessionId, a2.SessionId); err != nil || !slices.Equal(ids, want) {
			t.Fatalf("ListSessions as alice = %v, %v; want her own %v", ids, err, want)
		}
		if in := infos[a1.SessionId]; in.Principal != "alice" || in.Owner != "a-worker" || in.TtlMs != a1.TtlMs || in.Locks != 1 ||
			in.RemainingMs <= 0 || in.RemainingMs > in.TtlMs {
			t.Errorf("ListSessions as alice: %v; want principal alice, owner a-worker, ttl %d, 1 lock, remaining in (0, ttl]", in, a1.TtlMs)
		}
		if ids, _, err := list(alice, &lockdv1.ListSessionsRequest{Principal: "alice", Limit: 1}); err != nil || len(ids) != 2 {
			t.Errorf("ListSessions as alice, her own filter, pages of 1 = %v, %v; want 2 sessions", ids, err)
		}
		ids, _, err = list(root, &lockdv1.ListSessionsRequest{Limit: 1})
		if want := sorted(a1.SessionId, a2.SessionId, b1.SessionId); err != nil || !slices.Equal(ids, want) {
			t.Errorf("ListSessions as root (admin on *) = %v, %v; want every session %v", ids, err, want)
		}
		if ids, _, err := list(root, &lockdv1.ListSessionsRequest{Principal: "bob"}); err != nil || !slices.Equal(ids, []string{b1.SessionId}) {
			t.Errorf("ListSessions as root, principal bob = %v, %v; want [%s]", ids, err, b1.SessionId)
		}

		// Refusals: another principal's sessions without admin on every
		// key (admin on w/ only does not do), anonymous, a bad token.
		for _, c := range []struct {
			name string
			ctx  context.Context
			req  *lockdv1.ListSessionsRequest
			code codes.Code
			why  string
		}{
			{"alice asking for bob's", alice, &lockdv1.ListSessionsRequest{Principal: "bob"}, codes.PermissionDenied, wireerr.ReasonAccessDenied},
			{"carol (admin on w/ only) asking for alice's", carol, &lockdv1.ListSessionsRequest{Principal: "alice"}, codes.PermissionDenied, wireerr.ReasonAccessDenied},
			{"anonymous", ctx, &lockdv1.ListSessionsRequest{}, codes.PermissionDenied, wireerr.ReasonAccessDenied},
			{"an unknown token", metadata.AppendToOutgoingContext(ctx, auth.AuthorizationHeader, "Bearer nope"), &lockdv1.ListSessionsRequest{}, codes.Unauthenticated, wireerr.ReasonUnauthenticated},
		} {
			if _, err := api.ListSessions(c.ctx, c.req); status.Code(err) != c.code || reason(err) != c.why {
				t.Errorf("ListSessions %s: %v; want %v %s", c.name, err, c.code, c.why)
			}
		}
		if ids, _, err := list(carol, &lockdv1.ListSessionsRequest{}); err != nil || len(ids) != 0 {
			t.Errorf("ListSessions as carol = %v, %v; want none of the others' sessions", ids, err)
		}

		// Listing extends nothing: a session nobody heartbeats ends
		// after its TTL however often it is listed.
		short := openRaw(t, bob, api, 2*time.Second)
		if ids, _, _ := list(bob, &lockdv1.ListSessionsRequest{}); !slices.Contains(ids, short.SessionId) {
			t.Fatalf("ListSessions as bob = %v; want %s listed", ids, short.SessionId)
		}
		testkit.Eventually(t, 30*time.Second, "the listed, silent session to end", func() bool {
			ids, _, err := list(bob, &lockdv1.ListSessionsRequest{})
			return err == nil && !slices.Contains(ids, short.SessionId)
		})
	})
}
