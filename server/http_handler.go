package server

import (
	"context"
	"net"
	"net/http"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/proto"

	"lock.dev/lockd/internal/console"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// httpHandler is the HTTP listener's handler: the web console under
// /console/ when lock.server.http.console is on (C5 #ct5-console), and the
// API behind the cross-origin protection and limitBody otherwise. The
// dispatch is by path prefix, not an http.ServeMux, so API paths are never
// cleaned or redirected.
func (s *Server) httpHandler(api http.Handler) http.Handler {
	api = nosniff(crossOrigin(limitBody(api)))
	h := api
	if s.cfg.HTTPConsole {
		ui := console.Handler(consoleRefusal)
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
// is refused with 421 PERMISSION_DENIED, reason HOST_NOT_LOOPBACK, before
// anything else, the web
// console included. A listener that is not bound to loopback needs TLS,
// whose certificate check in the browser fails for a rebound name.
func loopbackHost(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackName(r.Host) {
			w.Header().Set("X-Content-Type-Options", "nosniff")
			writeError(w, http.StatusMisdirectedRequest, wireerr.Status(wireerr.ReasonHostNotLoopback, "Host is not a loopback name or address", nil))
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
// with 403 PERMISSION_DENIED, reason CROSS_ORIGIN (C5 #ct5-http): a page of another origin must
// not make a browser that holds a client certificate, or reaches a
// loopback API without access rules, take, release or revoke locks.
// Clients that are not browsers send neither header.
func crossOrigin(h http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusForbidden, wireerr.Status(wireerr.ReasonCrossOrigin, "cross-origin request refused", nil))
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
