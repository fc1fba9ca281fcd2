package client_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// TestSessionSecretSent: the SDK sends its session's secret on every call
// (a server that requires it serves the SDK), and a refusal of the secret
// — here a wrong one, forced by an interceptor — is ErrPermissionDenied,
// never ErrNotOwner, on Acquire and on Release; a refused heartbeat ends
// the session with it (C2 #ct2-ownership).
func TestSessionSecretSent(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		var corrupt atomic.Bool
		spoil := func(req any) {
			if !corrupt.Load() {
				return
			}
			switch r := req.(type) {
			case *lockdv1.AcquireRequest:
				r.SessionSecret = make([]byte, 32)
			case *lockdv1.ReleaseRequest:
				r.SessionSecret = make([]byte, 32)
			case *lockdv1.KeepAliveRequest:
				if len(r.Batch) == 0 {
					r.SessionSecret = make([]byte, 32)
				}
				for _, e := range r.Batch {
					e.SessionSecret = make([]byte, 32)
				}
			}
		}
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{ClientOptions: []client.Option{client.WithDialOptions(
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				spoil(req)
				return invoker(ctx, method, req, reply, cc, opts...)
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				cs, err := streamer(ctx, desc, cc, method, opts...)
				return spoiled{cs, spoil}, err
			}),
		)}})
		ctx := testCtx(t, time.Minute)
		s := newSession(t, ctx, srv.Client)
		l, err := s.Acquire(ctx, "k")
		if err != nil {
			t.Fatalf("Acquire with the SDK's own secret: %v", err)
		}

		corrupt.Store(true)
		if _, err := s.TryAcquire(ctx, "k2"); !errors.Is(err, client.ErrPermissionDenied) || errors.Is(err, client.ErrNotOwner) {
			t.Errorf("TryAcquire with a wrong secret = %v; want ErrPermissionDenied (not ErrNotOwner)", err)
		}
		if err := l.Release(ctx); !errors.Is(err, client.ErrPermissionDenied) || errors.Is(err, client.ErrNotOwner) {
			t.Errorf("Release with a wrong secret = %v; want ErrPermissionDenied (not ErrNotOwner)", err)
		}
		select {
		case <-s.Done():
		case <-time.After(4 * lockdtest.TTL):
			t.Fatal("session still open after its heartbeats were refused for 4 TTLs")
		}
		if !errors.Is(s.Err(), client.ErrPermissionDenied) {
			t.Errorf("session Err after refused heartbeats = %v; want ErrPermissionDenied", s.Err())
		}
	})
}

// spoiled is a client stream whose sent messages pass through spoil first.
type spoiled struct {
	grpc.ClientStream
	spoil func(any)
}

func (s spoiled) SendMsg(m any) error {
	s.spoil(m)
	return s.ClientStream.SendMsg(m)
}
