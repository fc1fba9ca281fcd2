package server

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// httpConn is one HTTP connection and its in-process gRPC connection.
type httpConn struct {
	a *httpAPI
	c net.Conn // as accepted: a *tls.Conn over TLS

	mu     sync.Mutex
	cc     *grpc.ClientConn
	closed bool
}

type httpConnKey struct{}

func (a *httpAPI) connContext(ctx context.Context, c net.Conn) context.Context {
	hc := &httpConn{a: a, c: c}
	a.mu.Lock()
	a.conns[c] = hc
	a.mu.Unlock()
	return context.WithValue(ctx, httpConnKey{}, hc)
}

func (a *httpAPI) connState(c net.Conn, st http.ConnState) {
	if st != http.StateClosed && st != http.StateHijacked {
		return
	}
	a.mu.Lock()
	hc := a.conns[c]
	delete(a.conns, c)
	a.mu.Unlock()
	if hc != nil {
		hc.close()
	}
}

// client returns the connection's in-process gRPC connection, made at the
// first request (the TLS handshake is complete by then).
func (hc *httpConn) client() (*grpc.ClientConn, error) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.closed {
		return nil, wireerr.Status(wireerr.ReasonShuttingDown, "the HTTP connection is closing", nil).Err()
	}
	if hc.cc != nil {
		return hc.cc, nil
	}
	var state *tls.ConnectionState
	if tc, ok := hc.c.(*tls.Conn); ok {
		st := tc.ConnectionState()
		state = &st
	}
	pipes := hc.a.pipes
	cc, err := grpc.NewClient("passthrough:///lockd-http",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return pipes.dial(ctx, state, hc.c.RemoteAddr(), hc.c.LocalAddr())
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()), // the pipe; the peer's security is pipeCreds'
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(inprocMaxRecv)),
	)
	if err != nil {
		return nil, wireerr.Status(wireerr.ReasonInternal, "in-process connection: "+err.Error(), nil).Err()
	}
	hc.cc = cc
	return cc, nil
}

func (hc *httpConn) close() {
	hc.mu.Lock()
	cc := hc.cc
	hc.cc, hc.closed = nil, true
	hc.mu.Unlock()
	if cc != nil {
		_ = cc.Close()
	}
}

// gatewayConn is the gateway's grpc.ClientConnInterface: it sends each call
// over the in-process connection of the HTTP connection the request came
// on (from the request's context).
type gatewayConn struct{ a *httpAPI }

func connOf(ctx context.Context) (*grpc.ClientConn, error) {
	hc, ok := ctx.Value(httpConnKey{}).(*httpConn)
	if !ok {
		return nil, wireerr.Status(wireerr.ReasonInternal, "request outside the HTTP/JSON listener", nil).Err()
	}
	return hc.client()
}

func (gatewayConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if err := checkOut(args); err != nil {
		return err
	}
	cc, err := connOf(ctx)
	if err != nil {
		return err
	}
	return cc.Invoke(ctx, method, args, reply, opts...)
}

func (gatewayConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cc, err := connOf(ctx)
	if err != nil {
		return nil, err
	}
	cs, err := cc.NewStream(ctx, desc, method, opts...)
	if err != nil {
		return nil, err
	}
	return checkedOut{cs}, nil
}

// checkedOut checks each request of a stream as Invoke does (checkOut).
type checkedOut struct{ grpc.ClientStream }

func (c checkedOut) SendMsg(m any) error {
	if err := checkOut(m); err != nil {
		return err
	}
	return c.ClientStream.SendMsg(m)
}

// pipeListener hands the in-process gRPC server the server ends of the
// gateway's pipes.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// dial makes a pipe whose server end carries state (nil: plaintext HTTP)
// and the HTTP connection's addresses.
func (l *pipeListener) dial(ctx context.Context, state *tls.ConnectionState, remote, local net.Addr) (net.Conn, error) {
	client, srv := net.Pipe()
	select {
	case l.conns <- &pipeConn{Conn: srv, state: state, remote: remote, local: local}:
		return client, nil
	case <-l.done:
	case <-ctx.Done():
	}
	_ = client.Close()
	_ = srv.Close()
	return nil, net.ErrClosed
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "lockd-http" }

// pipeConn is the server end of a gateway pipe: the HTTP connection's TLS
// state and addresses travel with it, so the in-process server's peer is
// the HTTP client's real address (the refusal rate's per-IP bucket, C2
// #ct2-limits; the connection guard, idle.go).
type pipeConn struct {
	net.Conn
	state         *tls.ConnectionState
	remote, local net.Addr
}

func (c *pipeConn) RemoteAddr() net.Addr { return c.remote }
func (c *pipeConn) LocalAddr() net.Addr  { return c.local }

// pipeCreds are the in-process server's transport credentials: no
// handshake (the pipe never leaves the process), and the peer's AuthInfo is
// the HTTP connection's — credentials.TLSInfo with its TLS state (the
// verified client certificate included) over HTTPS, plaintext otherwise.
// A connection that is not a gateway pipe is refused.
type pipeCreds struct{}

// plainInfo is the AuthInfo of a plaintext HTTP connection.
type plainInfo struct{ credentials.CommonAuthInfo }

func (plainInfo) AuthType() string { return "insecure" }

func (pipeCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	pc, ok := c.(*pipeConn)
	if !ok {
		return nil, nil, errors.New("server: the in-process gRPC server takes only the HTTP gateway's connections")
	}
	if pc.state == nil {
		return c, plainInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
	}
	return c, credentials.TLSInfo{State: *pc.state, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
}

func (pipeCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("server: pipeCreds are server-side only")
}

func (pipeCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "lockd-http"}
}

func (pipeCreds) Clone() credentials.TransportCredentials { return pipeCreds{} }

func (pipeCreds) OverrideServerName(string) error { return nil }
