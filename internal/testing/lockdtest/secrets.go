package lockdtest

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// secrets maps session ids to the secrets OpenSession returned through a
// connection made with SessionSecrets, for the whole test binary (a session
// opened through one replica may be used through another).
var secrets sync.Map // session id → []byte

// SessionSecrets returns dial options for raw lockd API clients in tests:
// they remember the session_secret of every OpenSession answer and put it
// into every Acquire, Release, CloseSession, KeepAlive, Heartbeat and SetValue request that names
// one of those sessions and carries no secret of its own, as the SDK does
// (C2 #ct2-ownership). Tests of the refusal itself dial without them, or set
// a secret explicitly.
func SessionSecrets() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(secretUnary),
		grpc.WithChainStreamInterceptor(secretStream),
	}
}

// SessionSecret returns the secret remembered for session id (nil if none).
func SessionSecret(id string) []byte {
	if v, ok := secrets.Load(id); ok {
		return v.([]byte)
	}
	return nil
}

func secretUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	req = withSecret(req)
	err := invoker(ctx, method, req, reply, cc, opts...)
	if r, ok := reply.(*lockdv1.OpenSessionResponse); ok && err == nil && len(r.GetSessionSecret()) > 0 {
		secrets.Store(r.GetSessionId(), r.GetSessionSecret())
	}
	return err
}

func secretStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return secretClientStream{cs}, nil
}

type secretClientStream struct{ grpc.ClientStream }

func (s secretClientStream) SendMsg(m any) error { return s.ClientStream.SendMsg(withSecret(m)) }

// withSecret returns req with the remembered secret of its session filled
// in (a copy: the caller's message is not changed), or req itself.
func withSecret(req any) any {
	var (
		id  string
		has bool
	)
	switch r := req.(type) {
	case *lockdv1.AcquireRequest:
		id, has = r.GetSessionId(), len(r.GetSessionSecret()) > 0
	case *lockdv1.ReleaseRequest:
		id, has = r.GetSessionId(), len(r.GetSessionSecret()) > 0
	case *lockdv1.CloseSessionRequest:
		id, has = r.GetSessionId(), len(r.GetSessionSecret()) > 0
	case *lockdv1.KeepAliveRequest:
		id, has = r.GetSessionId(), len(r.GetSessionSecret()) > 0
	case *lockdv1.SetValueRequest:
		id, has = r.GetSessionId(), len(r.GetSessionSecret()) > 0
	case *lockdv1.HeartbeatRequest:
		id, has = r.GetSessionId(), len(r.GetSessionSecret()) > 0
	default:
		return req
	}
	secret := SessionSecret(id)
	if has || secret == nil {
		return req
	}
	c := proto.Clone(req.(proto.Message))
	switch r := c.(type) {
	case *lockdv1.AcquireRequest:
		r.SessionSecret = secret
	case *lockdv1.ReleaseRequest:
		r.SessionSecret = secret
	case *lockdv1.CloseSessionRequest:
		r.SessionSecret = secret
	case *lockdv1.KeepAliveRequest:
		r.SessionSecret = secret
	case *lockdv1.SetValueRequest:
		r.SessionSecret = secret
	case *lockdv1.HeartbeatRequest:
		r.SessionSecret = secret
	}
	return c
}
