package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// TestKeepAliveStreamWithoutLiveSessionEnds (issue 23 F2, C2
// #ct2-ownership): a KeepAlive stream whose request names no live session
// of its caller — unknown, malformed, or another's session with a wrong
// secret — while it carries none gets its answer and then ends
// FAILED_PRECONDITION SESSION_DEAD, so streams cannot be parked by naming
// made-up sessions. A stream carrying a live session is kept. On the old
// code the stream stayed open: Recv waited until the test's bound.
func TestKeepAliveStreamWithoutLiveSessionEnds(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true})
		ctx := testCtx(t, 60*time.Second)
		api := dial(t, srv.Addr)
		bare := dialBare(t, srv.Addr)
		live := openRaw(t, ctx, api, longTTL)

		for _, tc := range []struct {
			name   string
			api    lockdv1.LockServiceClient
			req    *lockdv1.KeepAliveRequest
			reason string // of the answer; "" for not live without error
		}{
			{"unknown", api, &lockdv1.KeepAliveRequest{SessionId: "NOSUCHSESSION0000000000000", RequestId: 1}, ""},
			{"malformed", api, &lockdv1.KeepAliveRequest{SessionId: "bad id", RequestId: 1}, ""},
			{"another's", bare, &lockdv1.KeepAliveRequest{SessionId: live.SessionId, RequestId: 1,
				SessionSecret: []byte("not the secret")}, wireerr.ReasonSessionSecretMismatch},
		} {
			t.Run(tc.name, func(t *testing.T) {
				// The bound only decides how long the old code is waited
				// for; the new code ends the stream right after the answer.
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				stream, err := tc.api.KeepAlive(sctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := stream.Send(tc.req); err != nil {
					t.Fatal(err)
				}
				r, err := stream.Recv()
				if err != nil {
					t.Fatalf("answer: %v; want the request answered first", err)
				}
				if r.Live || (tc.reason == "" && r.Error != nil) || (tc.reason != "" && r.GetError().GetReason() != tc.reason) {
					t.Fatalf("answer %v; want not live, reason %q", r, tc.reason)
				}
				_, err = stream.Recv()
				st := status.Convert(err)
				if st.Code() != codes.FailedPrecondition || wireerr.Reason(st) != wireerr.ReasonSessionDead ||
					st.Message() != "keepalive stream carries no live session of its caller" {
					t.Fatalf("after the answer: %v; want the stream ended FAILED_PRECONDITION SESSION_DEAD", err)
				}
			})
		}

		// A stream that carries a live session is kept after a request
		// naming an unknown one.
		stream, err := api.KeepAlive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		beat := func(id string, rid uint64, wantLive bool) {
			t.Helper()
			if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: id, RequestId: rid}); err != nil {
				t.Fatal(err)
			}
			r, err := stream.Recv()
			if err != nil || r.RequestId != rid || r.Live != wantLive {
				t.Fatalf("request %d: %v, %v; want answered, live=%v", rid, r, err, wantLive)
			}
		}
		beat(live.SessionId, 1, true)
		beat("NOSUCHSESSION0000000000000", 2, false)
		beat(live.SessionId, 3, true)
	})
}

// carryOwnSession opens a session through api and heartbeats it on ka, so
// that ka carries a live session of its caller: the refusal tests that
// send many refused heartbeats on one stream need one (a stream carrying
// none is ended after its first refused or not-live answer, C2
// #ct2-ownership).
func carryOwnSession(t *testing.T, ctx context.Context, api lockdv1.LockServiceClient, ka lockdv1.LockService_KeepAliveClient) {
	t.Helper()
	own := openRaw(t, ctx, api, longTTL)
	const rid = 1 << 40 // no test's own request id
	if r := kaAnswer(t, ka, &lockdv1.KeepAliveRequest{SessionId: own.SessionId, SessionSecret: own.SessionSecret, RequestId: rid}); !r.Live {
		t.Fatalf("the stream's own session answered %v; want live", r)
	}
}
