package server

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	gateway "lock.dev/lockd/proto/lockd/v1/gateway"
)

// The HTTP/JSON API (C2 #ct2-http, C5 #ct5-http). grpc-gateway translates
// each HTTP request into a call of LockService on inproc, a second gRPC
// server of this process with the same service, interceptors (input checks,
// access rules, limits) and stats handler as the public one; only its
// transport differs. Every HTTP connection gets its own in-process gRPC
// connection (a net.Pipe), opened at its first request and closed with it,
// whose peer is that HTTP connection: its TLS state, verified client
// certificate included, becomes the gRPC peer's AuthInfo (pipeCreds), so the
// same identity code sees the same certificate it would see over gRPC, and
// the bearer token travels as the same "authorization" metadata. Nothing
// else of the HTTP request becomes metadata. So an HTTP call is decided,
// limited (one HTTP connection is one connection against max-connections),
// logged and counted exactly as the same call over gRPC, and the public
// gRPC server is untouched.

// HTTP transport bounds (C5 #ct5-http).
const (
	// maxHTTPBody bounds a request body: a request message is at most
	// MaxRecvMsgSize encoded, and JSON (base64 bytes, names) is larger.
	maxHTTPBody = maxReadMsgSize
	// inprocMaxRecv bounds an answer on the in-process hop: a List page of
	// 1000 locks with 4 KiB values is about 5 MB.
	inprocMaxRecv = 64 << 20
)

// httpAPI is the HTTP/JSON listener's state.
type httpAPI struct {
	inproc *grpc.Server
	pipes  *pipeListener
	srv    *http.Server

	mu     sync.Mutex
	conns  map[net.Conn]*httpConn // open HTTP connections
	closed bool                   // Shutdown began: no new in-process connections
}

// newHTTPAPI builds the gateway over a new in-process gRPC server made with
// opts (the public server's options but its credentials); serve starts it.
func (s *Server) newHTTPAPI(opts []grpc.ServerOption) *httpAPI {
	a := &httpAPI{
		inproc: grpc.NewServer(append([]grpc.ServerOption{grpc.Creds(pipeCreds{})}, opts...)...),
		pipes:  newPipeListener(),
		conns:  map[net.Conn]*httpConn{},
	}
	lockdv1.RegisterLockServiceServer(a.inproc, service{Server: s})
	jsonPb := &runtime.JSONPb{
		MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
		UnmarshalOptions: protojson.UnmarshalOptions{},
	}
	none := func(string) (string, bool) { return "", false }
	incoming := none
	if s.tp != nil {
		incoming = traceHeaders // and traceparent, tracestate when tracing is on (C2 #ct2-tracing)
	}
	mux := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, jsonPb),
		// Only the Authorization header becomes metadata (the gateway
		// forwards it by itself); no Grpc-Metadata-* header, and no
		// metadata back to the client.
		runtime.WithIncomingHeaderMatcher(incoming),
		runtime.WithOutgoingHeaderMatcher(none),
		runtime.WithOutgoingTrailerMatcher(none),
		runtime.WithErrorHandler(httpError),
		runtime.WithRoutingErrorHandler(routingError),
		runtime.WithForwardResponseOption(streamStart),
	)
	// Registration only records routes: it cannot fail for a client.
	_ = gateway.RegisterLockServiceHandlerClient(context.Background(), mux, lockdv1.NewLockServiceClient(gatewayConn{a}))
	a.srv = &http.Server{
		Handler:           s.httpHandler(mux),
		ReadHeaderTimeout: s.cfg.HTTPReadHeaderTimeout, // also bounds the TLS handshake
		IdleTimeout:       s.cfg.IdleTimeout,
		ConnContext:       a.connContext,
		ConnState:         a.connState,
		ErrorLog:          s.translog.HTTPErrorLog(telemetry.ListenerHTTP), // TLS handshake errors … as C4 events, rate-limited
	}
	return a
}

// ServeHTTPAPI serves the HTTP/JSON API on lis (over TLS when
// lock.server.tls.* is set) until Shutdown; it returns nil after Shutdown
// and the listener's error otherwise. It needs lock.server.http.listen set
// in the server's Config.
func (s *Server) ServeHTTPAPI(lis net.Listener) error {
	if s.http == nil {
		return errors.New("server: the HTTP/JSON API is off (lock.server.http.listen is empty)")
	}
	lis = s.guard.listener(lis, telemetry.ListenerHTTP) // before TLS: a handshake that never ends is bounded too
	if s.httpTLS != nil {
		lis = tls.NewListener(lis, s.httpTLS.Config())
	}
	err := s.http.srv.Serve(lis)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// shutdown stops the HTTP listener, waits for its requests and connections,
// then stops the in-process gRPC server; what is left when ctx ends is cut
// off. Waits and watches end because Shutdown ends their gRPC handlers.
func (a *httpAPI) shutdown(ctx context.Context) error {
	err := a.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, a.srv.Close())
	}
	defer func() {
		stopped := make(chan struct{})
		go func() { // exits when GracefulStop returns (bounded: Stop below)
			a.inproc.GracefulStop()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-ctx.Done():
			a.inproc.Stop()
			<-stopped
		}
	}()
	a.mu.Lock()
	a.closed = true
	conns := a.conns
	a.conns = map[net.Conn]*httpConn{}
	a.mu.Unlock()
	for _, hc := range conns {
		hc.close()
	}
	return err
}
