package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// principalPolicy lets every caller, anonymous included, lock and read
// every key: only the session binding can refuse a call.
const principalPolicy = `
rules:
  - name: all
    principals: ["*", anonymous]
    prefixes: ["*"]
    allow: [read, lock]
`

// TestSessionPrincipalBinding checks C2 #ct2-ownership's binding to the
// opener's principal on real backends: alice opens a session (bearer
// token) and takes a lock; bob, and an anonymous caller, sending alice's
// own secret (from alice's raw OpenSession answer), are refused
// SESSION_PRINCIPAL_MISMATCH on Acquire, Release, KeepAlive and
// CloseSession, which change nothing; each refusal is an auth_denied event
// and counted; alice's calls still work. An anonymous opener's session is
// bound to its secret only.
func TestSessionPrincipalBinding(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		az, _ := authFiles(t, principalPolicy, "alice", "bob")
		logs := &lockdtest.Logs{}
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Auth: az, NoClient: true, Logger: logs.Logger()})
		api := dialBare(t, srv.Addr)
		ctx := testCtx(t, 2*time.Minute)
		alice := as(ctx, "alice")

		open := openRaw(t, alice, api, longTTL)
		sid, secret := open.SessionId, open.SessionSecret
		acq, err := api.Acquire(alice, &lockdv1.AcquireRequest{SessionId: sid, SessionSecret: secret, Key: "p/a"})
		if err != nil || !acq.Granted {
			t.Fatalf("alice: Acquire(p/a) = %v, %v; want granted", acq, err)
		}
		token := acq.Token

		for _, who := range []struct {
			name string
			ctx  context.Context
		}{{"bob", as(ctx, "bob")}, {"anonymous", ctx}} {
			c := who.ctx
			_, err := api.Acquire(c, &lockdv1.AcquireRequest{SessionId: sid, SessionSecret: secret, Key: "p/b"})
			wantDenied(t, who.name+": Acquire(alice's session, p/b)", err, wireerr.ReasonSessionPrincipalMismatch)
			_, err = api.Release(c, &lockdv1.ReleaseRequest{SessionId: sid, SessionSecret: secret, Key: "p/a", Token: token})
			wantDenied(t, who.name+": Release(alice's session, p/a)", err, wireerr.ReasonSessionPrincipalMismatch)
			_, err = api.CloseSession(c, &lockdv1.CloseSessionRequest{SessionId: sid, SessionSecret: secret})
			wantDenied(t, who.name+": CloseSession(alice's session)", err, wireerr.ReasonSessionPrincipalMismatch)

			kctx, kcancel := context.WithCancel(c)
			stream, err := api.KeepAlive(kctx)
			if err != nil {
				t.Fatalf("%s: KeepAlive: %v", who.name, err)
			}
			if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: sid, SessionSecret: secret, RequestId: 1}); err != nil {
				t.Fatalf("%s: KeepAlive send: %v", who.name, err)
			}
			for {
				r, err := stream.Recv()
				if err != nil {
					t.Fatalf("%s: KeepAlive recv: %v", who.name, err)
				}
				if len(r.GetLost()) > 0 || r.GetHeld() != nil || r.GetRemainingMs() != 0 {
					t.Fatalf("%s: KeepAlive got %v; want nothing of alice's session", who.name, r)
				}
				if r.GetRequestId() != 1 {
					continue
				}
				if e := r.GetError(); e == nil || codes.Code(e.Code) != codes.PermissionDenied || e.Reason != wireerr.ReasonSessionPrincipalMismatch {
					t.Fatalf("%s: KeepAlive(alice's session) = %v; want error PERMISSION_DENIED %s", who.name, r, wireerr.ReasonSessionPrincipalMismatch)
				}
				break
			}
			kcancel()
		}

		// Nothing changed: alice still holds p/a, p/b is free.
		if r, err := api.Inspect(alice, &lockdv1.InspectRequest{Key: "p/a"}); err != nil || r.GetLock().GetSessionId() != sid || r.GetLock().GetToken() != token {
			t.Fatalf("Inspect(p/a) after the refusals = %v, %v; want held by %s, token %d", r, err, sid, token)
		}
		if r, err := api.Inspect(alice, &lockdv1.InspectRequest{Key: "p/b"}); err != nil || r.GetHeld() {
			t.Fatalf("Inspect(p/b) after the refusals = %v, %v; want free", r, err)
		}

		// Refusals are C4 events and metrics.
		for _, m := range []string{"Acquire", "Release", "CloseSession", "KeepAlive"} {
			if n := deniedCount(t, srv, m, telemetry.DeniedPrincipalMismatch); n != 2 {
				t.Errorf("lockd_auth_denied_total{method=%q,reason=%q} = %v; want 2", m, telemetry.DeniedPrincipalMismatch, n)
			}
		}
		if ev := logs.Find(telemetry.EventAuthDenied, map[string]string{"reason": telemetry.DeniedPrincipalMismatch}); len(ev) != 8 {
			t.Errorf("auth_denied events with reason %s: %d; want 8", telemetry.DeniedPrincipalMismatch, len(ev))
		}

		// Alice's own calls work.
		stream, err := api.KeepAlive(alice)
		if err != nil {
			t.Fatalf("alice: KeepAlive: %v", err)
		}
		if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: sid, SessionSecret: secret, RequestId: 7}); err != nil {
			t.Fatalf("alice: KeepAlive send: %v", err)
		}
		for {
			r, err := stream.Recv()
			if err != nil {
				t.Fatalf("alice: KeepAlive recv: %v", err)
			}
			if r.GetRequestId() != 7 {
				continue
			}
			if r.GetError() != nil || !r.GetLive() {
				t.Fatalf("alice: KeepAlive = %v; want live, no error", r)
			}
			break
		}
		if _, err := api.Release(alice, &lockdv1.ReleaseRequest{SessionId: sid, SessionSecret: secret, Key: "p/a", Token: token}); err != nil {
			t.Errorf("alice: Release(p/a): %v", err)
		}
		if r, err := api.CloseSession(alice, &lockdv1.CloseSessionRequest{SessionId: sid, SessionSecret: secret}); err != nil {
			t.Errorf("alice: CloseSession = %v, %v", r, err)
		}

		// An anonymous opener's session: bob with its secret may use it.
		anon := openRaw(t, ctx, api, longTTL)
		if r, err := api.Acquire(as(ctx, "bob"), &lockdv1.AcquireRequest{SessionId: anon.SessionId, SessionSecret: anon.SessionSecret, Key: "p/c"}); err != nil || !r.Granted {
			t.Errorf("bob: Acquire(p/c) in an anonymous session with its secret = %v, %v; want granted", r, err)
		}
	})
}
