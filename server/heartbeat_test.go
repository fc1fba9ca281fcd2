package server_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/store"
)

// TestHeartbeatUnary: the Heartbeat RPC answers like one KeepAlive request
// (C2 #ct2-http): live with remaining_ms, the held set, pending notices
// until acknowledged, refusals and transient errors as the call's error,
// a closed session not live; and heartbeats alone keep a session alive
// past its TTL (the silence close counts them).
func TestHeartbeatUnary(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		var faulty *lockdtest.Faulty
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true,
			Wrap: func(st store.LockStore) store.LockStore { faulty = lockdtest.NewFaulty(st); return faulty }})
		ctx := testCtx(t, 90*time.Second)
		api := dial(t, srv.Addr)
		bare := dialBare(t, srv.Addr)

		s := openRaw(t, ctx, api, longTTL)
		beat := func(acks ...uint64) *lockdv1.HeartbeatResponse {
			t.Helper()
			r, err := api.Heartbeat(ctx, &lockdv1.HeartbeatRequest{SessionId: s.SessionId, Ack: acks})
			if err != nil {
				t.Fatalf("Heartbeat: %v", err)
			}
			return r
		}
		if r := beat(); !r.Live || r.RemainingMs <= 0 || r.Held == nil || len(r.Held.Locks) != 0 || len(r.Lost) != 0 {
			t.Errorf("Heartbeat of a new session = %v; want live, remaining, an empty held set", r)
		}
		g, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: s.SessionId, Key: "hb/a"})
		if err != nil || !g.Granted {
			t.Fatalf("Acquire = %v, %v; want granted", g, err)
		}
		if r := beat(); !r.Live || r.Held == nil || len(r.Held.Locks) != 1 || r.Held.Locks[0].Key != "hb/a" || r.Held.Locks[0].Token != g.Token {
			t.Errorf("Heartbeat while holding hb/a = %v; want it in held", r)
		}
		if _, err := api.Revoke(ctx, &lockdv1.RevokeRequest{Key: "hb/a"}); err != nil {
			t.Fatalf("Revoke: %v", err)
		}
		var notice *lockdv1.LockLost
		testkit.Eventually(t, 30*time.Second, "a lock-lost notice in a Heartbeat answer after a revoke", func() bool {
			if r := beat(); len(r.Lost) == 1 {
				notice = r.Lost[0]
			}
			return notice != nil
		})
		if notice.Key != "hb/a" || notice.Token != g.Token || notice.Reason != lockdv1.LockLostReason_LOCK_LOST_REASON_REVOKED || notice.NoticeId == 0 {
			t.Errorf("notice = %v; want hb/a, token %d, REVOKED, a notice id", notice, g.Token)
		}
		if r := beat(); len(r.Lost) != 1 || len(r.Held.Locks) != 0 {
			t.Errorf("Heartbeat before the ack = %v; want the notice repeated and nothing held", r)
		}
		beat(notice.NoticeId)
		if r := beat(); len(r.Lost) != 0 {
			t.Errorf("Heartbeat after the ack = %v; want no notice", r)
		}

		// Refusals: the call's error; nothing acknowledged or extended.
		_, err = bare.Heartbeat(ctx, &lockdv1.HeartbeatRequest{SessionId: s.SessionId})
		wantDenied(t, "Heartbeat without a secret", err, wireerr.ReasonSessionSecretRequired)
		_, err = bare.Heartbeat(ctx, &lockdv1.HeartbeatRequest{SessionId: s.SessionId, SessionSecret: randomSecret(32)})
		wantDenied(t, "Heartbeat with a wrong secret", err, wireerr.ReasonSessionSecretMismatch)
		if got := deniedCount(t, srv, "Heartbeat", "session_secret_mismatch"); got != 1 {
			t.Errorf("lockd_auth_denied_total{method=Heartbeat,reason=session_secret_mismatch} = %v; want 1", got)
		}
		_, err = api.Heartbeat(ctx, &lockdv1.HeartbeatRequest{SessionId: "bad id"})
		if status.Code(err) != codes.InvalidArgument || reason(err) != wireerr.ReasonInvalidArgument {
			t.Errorf("Heartbeat of a malformed id: %v; want INVALID_ARGUMENT", err)
		}
		// A transient backend error is the call's retryable error.
		faulty.Fail("heartbeat", store.ErrUnavailable)
		_, err = api.Heartbeat(ctx, &lockdv1.HeartbeatRequest{SessionId: s.SessionId})
		if status.Code(err) != codes.Unavailable || reason(err) != wireerr.ReasonUnavailable {
			t.Errorf("Heartbeat during an outage: %v; want UNAVAILABLE", err)
		}
		faulty.Fail("heartbeat", nil)
		if r := beat(); !r.Live {
			t.Errorf("Heartbeat after the outage = %v; want live", r)
		}

		// Heartbeats alone keep a short session alive well past its TTL
		// (the server's silence close counts them), at the advertised
		// interval.
		short := openRaw(t, ctx, api, lockdtest.TTL)
		end := time.Now().Add(2 * lockdtest.TTL)
		tick := time.NewTicker(time.Duration(short.HeartbeatIntervalMs) * time.Millisecond)
		defer tick.Stop()
		for n := 0; time.Now().Before(end); n++ {
			r, err := api.Heartbeat(ctx, &lockdv1.HeartbeatRequest{SessionId: short.SessionId})
			if err != nil || !r.Live || r.RemainingMs <= 0 {
				t.Fatalf("heartbeat %d of a session kept alive by Heartbeat = %v, %v; want live", n, r, err)
			}
			<-tick.C // pacing, not synchronisation
		}

		// A closed session is not live (200, not an error).
		if _, err := api.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: s.SessionId}); err != nil {
			t.Fatalf("CloseSession: %v", err)
		}
		if r := beat(); r.Live || r.RemainingMs != 0 {
			t.Errorf("Heartbeat of a closed session = %v; want live=false", r)
		}
	})
}
