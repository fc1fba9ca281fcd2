package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"lock.dev/lockd/internal/console"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	gateway "lock.dev/lockd/proto/lockd/v1/gateway"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
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
	// httpIdleTimeout closes idle keep-alive connections (and with them
	// their in-process gRPC connection).
	httpIdleTimeout = 2 * time.Minute
	// httpHeaderTimeout bounds the arrival of a request's headers.
	httpHeaderTimeout = 10 * time.Second
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
	mux := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, jsonPb),
		// Only the Authorization header becomes metadata (the gateway
		// forwards it by itself); no Grpc-Metadata-* header, and no
		// metadata back to the client.
		runtime.WithIncomingHeaderMatcher(none),
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
		ReadHeaderTimeout: httpHeaderTimeout,
		IdleTimeout:       httpIdleTimeout,
		ConnContext:       a.connContext,
		ConnState:         a.connState,
		ErrorLog:          nil, // net/http's own log (TLS handshake errors) goes to the standard logger
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
		return nil, status.Error(codes.Unavailable, "the HTTP connection is closing")
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
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return pipes.dial(ctx, state) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()), // the pipe; the peer's security is pipeCreds'
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(inprocMaxRecv)),
	)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "in-process connection: %v", err)
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
		return nil, status.Error(codes.Internal, "request outside the HTTP/JSON listener")
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

// dial makes a pipe whose server end carries state (nil: plaintext HTTP).
func (l *pipeListener) dial(ctx context.Context, state *tls.ConnectionState) (net.Conn, error) {
	client, srv := net.Pipe()
	select {
	case l.conns <- &pipeConn{Conn: srv, state: state}:
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
// state travels with it.
type pipeConn struct {
	net.Conn
	state *tls.ConnectionState
}

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

// httpHandler is the HTTP listener's handler: the web console under
// /console/ when lock.server.http.console is on (C5 #ct5-console), and the
// API behind the cross-origin protection and limitBody otherwise. The
// dispatch is by path prefix, not an http.ServeMux, so API paths are never
// cleaned or redirected.
func (s *Server) httpHandler(api http.Handler) http.Handler {
	api = nosniff(crossOrigin(limitBody(api)))
	h := api
	if s.cfg.HTTPConsole {
		ui := console.Handler()
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if p := r.URL.Path; p+"/" == console.Prefix || strings.HasPrefix(p, console.Prefix) {
				ui.ServeHTTP(w, r)
				return
			}
			api.ServeHTTP(w, r)
		})
	}
	if IsLoopback(s.cfg.HTTPListen) {
		h = loopbackHost(h)
	}
	return h
}

// loopbackHost guards a listener bound to loopback against DNS rebinding
// (C5 #ct5-http): a web page whose name an attacker re-points at 127.0.0.1
// is same-origin to the browser, so neither the cross-origin check nor the
// absence of CORS stops it. Its requests carry the attacker's name as Host,
// so a request whose Host (port aside) is not "localhost" or a loopback IP
// is refused with 421 PERMISSION_DENIED before anything else, the web
// console included. A listener that is not bound to loopback needs TLS,
// whose certificate check in the browser fails for a rebound name.
func loopbackHost(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackName(r.Host) {
			w.Header().Set("X-Content-Type-Options", "nosniff")
			writeError(w, http.StatusMisdirectedRequest, status.New(codes.PermissionDenied, "Host is not a loopback name or address"))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// loopbackName reports whether the host of an HTTP Host value (with or
// without a port) is "localhost" or a loopback IP; names are never
// resolved.
func loopbackName(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// nosniff marks every API answer (JSON, or NDJSON for Watch) as not to be
// content-sniffed by a browser (C5 #ct5-http).
func nosniff(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		h.ServeHTTP(w, r)
	})
}

// crossOrigin refuses a request other than GET, HEAD or OPTIONS that a
// browser marks as cross-origin (Sec-Fetch-Site, else Origin against Host)
// with 403 PERMISSION_DENIED (C5 #ct5-http): a page of another origin must
// not make a browser that holds a client certificate, or reaches a
// loopback API without access rules, take, release or revoke locks.
// Clients that are not browsers send neither header.
func crossOrigin(h http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusForbidden, status.New(codes.PermissionDenied, "cross-origin request refused"))
	}))
	return cop.Handler(h)
}

// limitBody bounds request bodies (maxHTTPBody; a longer one fails to
// decode: INVALID_ARGUMENT) and keeps an Authorization header that cannot
// be gRPC metadata from being dropped by the gateway, which would make the
// caller anonymous: it is replaced by a value the server refuses as a
// malformed authorization (UNAUTHENTICATED, logged and counted as over
// gRPC).
func limitBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w = &headerOnce{ResponseWriter: w}
		r.Body = http.MaxBytesReader(w, r.Body, maxHTTPBody)
		if vals := r.Header.Values("Authorization"); len(vals) > 0 {
			for i, v := range vals {
				if !printableASCII(v) {
					vals[i] = "malformed (not printable ASCII)"
				}
			}
		}
		h.ServeHTTP(w, r)
	})
}

// headerOnce ignores a second WriteHeader: a Watch whose headers were sent
// when it was established (streamStart) and that ends with an error
// before its first event is answered with the error line only.
type headerOnce struct {
	http.ResponseWriter
	wrote bool
}

func (h *headerOnce) WriteHeader(code int) {
	if h.wrote {
		return
	}
	h.wrote = true
	h.ResponseWriter.WriteHeader(code)
}

func (h *headerOnce) Write(b []byte) (int, error) {
	h.wrote = true
	return h.ResponseWriter.Write(b)
}

func (h *headerOnce) Unwrap() http.ResponseWriter { return h.ResponseWriter }

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// streamStart runs when a server stream (Watch) has its gRPC headers,
// before its first message: when the server sent them (the watch is
// established), it sends the HTTP response headers at once, so the client
// knows it (C2 #ct2-http). A stream that failed first (no headers: a
// refusal, an invalid prefix) is left to the gateway, which answers with
// the error's status.
func streamStart(ctx context.Context, w http.ResponseWriter, m proto.Message) error {
	if m != nil {
		return nil
	}
	if md, ok := runtime.ServerMetadataFromContext(ctx); !ok || md.HeaderMD == nil {
		return nil
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	return http.NewResponseController(w).Flush()
}

// httpError writes an error answer: the HTTP status of the gRPC code and
// the google.rpc.Status JSON plus "reason", the lockd ErrorInfo reason
// (C2 #ct2-http).
func httpError(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, _ *http.Request, err error) {
	if hse, ok := errors.AsType[*runtime.HTTPStatusError](err); ok {
		writeError(w, hse.HTTPStatus, status.Convert(hse.Err))
		return
	}
	st := status.Convert(err)
	if st.Code() == codes.InvalidArgument && wireerr.Reason(st) == "" && strings.Contains(st.Message(), "http: request body too large") {
		// The gateway's decoding hit limitBody's bound (C2 #ct2-bad-input).
		writeError(w, http.StatusRequestEntityTooLarge, status.Convert(badInputStatus(
			invalidf("request", "the body is over the %d KiB bound (C2 #ct2-bad-input)", maxHTTPBody>>10))))
		return
	}
	writeError(w, runtime.HTTPStatusFromCode(st.Code()), st)
}

// routingError answers a request no route takes: 404 for an unknown path,
// 405 for a known path with another method, 400 for a malformed one.
func routingError(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, _ *http.Request, httpStatus int) {
	code := codes.NotFound
	switch httpStatus {
	case http.StatusMethodNotAllowed:
		code = codes.Unimplemented
	case http.StatusBadRequest:
		code = codes.InvalidArgument
	}
	writeError(w, httpStatus, status.New(code, http.StatusText(httpStatus)))
}

func writeError(w http.ResponseWriter, httpStatus int, st *status.Status) {
	body, merr := errorBody(st)
	if merr != nil {
		body = []byte(`{"code":13,"message":"failed to encode the error","reason":"INTERNAL","details":[]}`)
	}
	w.Header().Del("Trailer")
	w.Header().Del("Transfer-Encoding")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus)
	_, _ = w.Write(body)
}

// errorBody is the JSON of st with its lockd reason.
func errorBody(st *status.Status) ([]byte, error) {
	raw, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(st.Proto())
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	reason, err := json.Marshal(wireerr.Reason(st))
	if err != nil {
		return nil, err
	}
	fields["reason"] = reason
	return json.Marshal(fields)
}
