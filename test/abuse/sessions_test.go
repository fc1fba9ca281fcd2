package abuse

import (
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// TestF3SessionsAndParkedStreams: alice opens sessions until the server
// refuses her; she gets her share (a quarter of lock.server.max-sessions, 4
// of 16 here), refused LIMIT principal_sessions beyond it, and bob's
// `lockd run` is still granted, holds its lock for 3 × TTL and exits 0.
// Then alice opens KeepAlive streams naming made-up sessions: each is ended
// SESSION_DEAD right after its answer, so none stays parked. (Before issue
// 23 alice took every session slot for their TTL and her streams stayed
// open.)
func TestF3SessionsAndParkedStreams(t *testing.T) {
	const bound = 16
	s := serve(t, newPKI(t), "--max-sessions", strconv.Itoa(bound))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alice := lockdv1.NewLockServiceClient(s.dial(t, "alice"))
	held := 0
	for range bound {
		_, err := alice.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: time.Hour.Milliseconds()})
		if err == nil {
			held++
			continue
		}
		if st := status.Convert(err); st.Code() != codes.ResourceExhausted || wireerr.Limit(st) != wireerr.LimitPrincipalSessions {
			t.Errorf("alice's session %d refused with %v (limit %q); want LIMIT principal_sessions", held+1, err, wireerr.Limit(st))
		}
	}
	if held >= bound {
		t.Errorf("alice keeps all %d sessions; want at most her share", held)
	}
	if r := holdRun(t, s); r.code != 0 {
		t.Errorf("bob's lockd run while alice keeps her share of sessions: %v", r)
	}

	for i := range 3 {
		sctx, scancel := context.WithTimeout(ctx, 30*time.Second) // bounds the old build's wait only
		stream, err := alice.KeepAlive(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: "MADEUPSESSION" + strconv.Itoa(1000000000000+i), RequestId: 1}); err != nil {
			t.Fatal(err)
		}
		if r, err := stream.Recv(); err != nil || r.Live {
			t.Fatalf("alice's made-up heartbeat %d: %v, %v; want answered not live", i, r, err)
		}
		_, err = stream.Recv()
		if st := status.Convert(err); st.Code() != codes.FailedPrecondition || wireerr.Reason(st) != wireerr.ReasonSessionDead {
			t.Errorf("alice's stream %d after a made-up heartbeat: %v; want ended SESSION_DEAD", i, err)
		}
		scancel()
	}
}
