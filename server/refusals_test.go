package server_test

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// from dials the server from the loopback address ip (another peer for the
// refusal rate, which keys anonymous callers by address).
func from(ip string) grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return d.DialContext(ctx, "tcp", addr)
	})
}

// kaAnswer sends one KeepAlive request and returns its answer.
func kaAnswer(t *testing.T, ka lockdv1.LockService_KeepAliveClient, req *lockdv1.KeepAliveRequest) *lockdv1.KeepAliveResponse {
	t.Helper()
	if err := ka.Send(req); err != nil {
		t.Fatalf("KeepAlive send: %v", err)
	}
	for {
		r, err := ka.Recv()
		if err != nil {
			t.Fatalf("KeepAlive recv: %v", err)
		}
		if r.GetRequestId() == req.RequestId {
			return r
		}
	}
}

// TestRefusalRate (C2 #ct2-limits, limit refusals): a flood of wrong-secret
// KeepAlives from one peer is refused as such up to the peer's burst, then
// answered RESOURCE_EXHAUSTED LIMIT, counted and no longer logged one by
// one; another peer's refusals are still answered PERMISSION_DENIED, and
// calls that pass access control — the owner's heartbeats, from the
// flooding address too — are never refused. Unary refusals (an unknown
// bearer token) are bounded the same way.
func TestRefusalRate(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		cfg := lockdtest.Config()
		cfg.RefusalRate = 1 // burst 10: the flood below is far faster
		log, logs := testkit.NewLogger()
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Config: &cfg, NoClient: true, Logger: log})
		ctx := testCtx(t, time.Minute)
		owner := dialBare(t, srv.Addr, append(lockdtest.SessionSecrets(), from("127.0.0.2"))...)
		o := openRaw(t, ctx, owner, longTTL)

		attacker := dialBare(t, srv.Addr, from("127.0.0.2"))
		ka, err := attacker.KeepAlive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		carryOwnSession(t, ctx, attacker, ka) // keepalive_parked_test.go
		const flood = 100
		denied, limited := 0, 0
		start := time.Now()
		for i := 1; i <= flood; i++ {
			r := kaAnswer(t, ka, &lockdv1.KeepAliveRequest{SessionId: o.SessionId, SessionSecret: randomSecret(32), RequestId: uint64(i)})
			e := r.GetError()
			switch {
			case r.GetLive() || e == nil:
				t.Fatalf("wrong secret %d answered %v; want a refusal", i, r)
			case codes.Code(e.Code) == codes.PermissionDenied && e.Reason == wireerr.ReasonSessionSecretMismatch:
				denied++
			case codes.Code(e.Code) == codes.ResourceExhausted && e.Reason == wireerr.ReasonLimit:
				limited++
			default:
				t.Fatalf("wrong secret %d answered %v; want PERMISSION_DENIED or RESOURCE_EXHAUSTED LIMIT", i, r)
			}
		}
		// Burst 10, plus one a second for however long the flood took.
		most := 10 + int(time.Since(start)/time.Second) + 1
		if denied < 10 || denied > most || limited != flood-denied {
			t.Errorf("flood of %d wrong secrets: %d PERMISSION_DENIED, %d LIMIT; want 10..%d denied, the rest LIMIT", flood, denied, limited, most)
		}
		if n := counter(t, srv.Registry, "lockd_limit_rejections_total", map[string]string{"limit": "refusals"}); n != float64(limited) {
			t.Errorf("lockd_limit_rejections_total{refusals} = %v; want %d", n, limited)
		}
		if n := len(logs.Events("auth_denied")); n != denied {
			t.Errorf("auth_denied events = %d; want %d (one per refusal answered as such)", n, denied)
		}

		// The owner, from the same address: its heartbeats pass access
		// control and are answered live.
		oka, err := owner.KeepAlive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if r := kaAnswer(t, oka, &lockdv1.KeepAliveRequest{SessionId: o.SessionId, RequestId: 1}); !r.GetLive() || r.GetError() != nil {
			t.Errorf("owner's heartbeat from the flooding address = %v; want live", r)
		}
		// Another peer's refusal is answered as such.
		other := dialBare(t, srv.Addr, from("127.0.0.3"))
		oka2, err := other.KeepAlive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r := kaAnswer(t, oka2, &lockdv1.KeepAliveRequest{SessionId: o.SessionId, SessionSecret: randomSecret(32), RequestId: 1})
		if e := r.GetError(); e == nil || codes.Code(e.Code) != codes.PermissionDenied {
			t.Errorf("another peer's wrong secret = %v; want PERMISSION_DENIED (its own bucket)", r)
		}

		// Unary: unknown bearer tokens from a fourth address.
		bad := metadata.AppendToOutgoingContext(ctx, auth.AuthorizationHeader, "Bearer not-a-token")
		api := dialBare(t, srv.Addr, from("127.0.0.4"))
		var codesSeen []codes.Code
		for range 30 {
			_, err := api.Inspect(bad, &lockdv1.InspectRequest{Key: "k"})
			codesSeen = append(codesSeen, status.Code(err))
			if status.Code(err) == codes.ResourceExhausted && wireerr.Limit(status.Convert(err)) != wireerr.LimitRefusals {
				t.Errorf("Inspect with a bad token past the rate: %v; want LIMIT with limit %s", err, wireerr.LimitRefusals)
			}
		}
		if slices.Index(codesSeen, codes.ResourceExhausted) < 10 || !slices.Contains(codesSeen, codes.Unauthenticated) ||
			codesSeen[len(codesSeen)-1] != codes.ResourceExhausted {
			t.Errorf("30 Inspects with a bad token answered %v; want UNAUTHENTICATED for the burst, then RESOURCE_EXHAUSTED", codesSeen)
		}
	})
}
