package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/tlsreload"
)

// Values of lock.server.tls.client-auth and lock.server.metrics-tls.client-auth
// (C5 #ct5-tls). Empty means ClientAuthRequire when a client CA is set and
// ClientAuthNone otherwise.
const (
	// ClientAuthNone asks for no client certificate.
	ClientAuthNone = "none"
	// ClientAuthRequest verifies a client certificate if one is sent.
	ClientAuthRequest = "request"
	// ClientAuthRequire refuses clients without a certificate that chains
	// to the client CA.
	ClientAuthRequire = "require"
)

// TLSFiles are one listener's TLS keys: lock.server.tls.* for the gRPC
// listener (Config.GRPCTLS), lock.server.metrics-tls.* for the metrics
// listener (Config.MetricsTLS).
type TLSFiles struct {
	CertFile     string
	KeyFile      string
	ClientCAFile string
	ClientAuth   string
}

// Enabled reports whether the listener serves TLS.
func (f TLSFiles) Enabled() bool { return f.CertFile != "" || f.KeyFile != "" }

// GRPCTLS returns the gRPC listener's TLS keys.
func (c Config) GRPCTLS() TLSFiles {
	return TLSFiles{CertFile: c.TLSCertFile, KeyFile: c.TLSKeyFile, ClientCAFile: c.TLSClientCAFile, ClientAuth: c.TLSClientAuth}
}

// MetricsTLS returns the metrics listener's TLS keys.
func (c Config) MetricsTLS() TLSFiles {
	return TLSFiles{CertFile: c.MetricsTLSCertFile, KeyFile: c.MetricsTLSKeyFile,
		ClientCAFile: c.MetricsTLSClientCAFile, ClientAuth: c.MetricsTLSClientAuth}
}

func (f TLSFiles) clientAuth() tls.ClientAuthType {
	switch f.ClientAuth {
	case ClientAuthRequest:
		return tls.VerifyClientCertIfGiven
	case ClientAuthRequire:
		return tls.RequireAndVerifyClientCert
	case "":
		if f.ClientCAFile != "" {
			return tls.RequireAndVerifyClientCert
		}
	}
	return tls.NoClientCert
}

// validate checks one listener's TLS keys; prefix is the keys' common part
// ("lock.server.tls.").
func (f TLSFiles) validate(prefix string, bad func(key, format string, args ...any)) {
	if (f.CertFile == "") != (f.KeyFile == "") {
		bad(prefix+"cert-file", "%scert-file and %skey-file must be set together", prefix, prefix)
	}
	if f.ClientCAFile != "" && !f.Enabled() {
		bad(prefix+"client-ca-file", "needs %scert-file and %skey-file (client certificates need TLS)", prefix, prefix)
	}
	switch f.ClientAuth {
	case "":
	case ClientAuthNone:
		if f.ClientCAFile != "" {
			bad(prefix+"client-auth", "none ignores %sclient-ca-file: use request or require, or drop the CA", prefix)
		}
	case ClientAuthRequest, ClientAuthRequire:
		if f.ClientCAFile == "" {
			bad(prefix+"client-auth", "%s needs %sclient-ca-file", f.ClientAuth, prefix)
		}
	default:
		bad(prefix+"client-auth", "%q is not one of none, request, require", f.ClientAuth)
	}
}

// validateListeners applies the loopback rule (C5 #ct5-tls): a listener on a
// non-loopback address needs TLS unless InsecureAllowRemote.
func (c Config) validateListeners(bad func(key, format string, args ...any)) {
	if c.InsecureAllowRemote {
		return
	}
	if c.Listen != "" && !c.GRPCTLS().Enabled() && !IsLoopback(c.Listen) {
		bad("lock.server.listen", "%q is not a loopback address and TLS is off: set lock.server.tls.cert-file and "+
			"lock.server.tls.key-file (or lock.server.insecure-allow-remote=true to serve plaintext anyway)", c.Listen)
	}
	if c.HTTPListen != "" && !c.GRPCTLS().Enabled() && !IsLoopback(c.HTTPListen) {
		bad("lock.server.http.listen", "%q is not a loopback address and TLS is off: set lock.server.tls.cert-file and "+
			"lock.server.tls.key-file (the HTTP/JSON API uses the gRPC listener's TLS; or lock.server.insecure-allow-remote=true "+
			"to serve plaintext anyway)", c.HTTPListen)
	}
	if c.MetricsListen != "" && c.MetricsListen != MetricsOff && !c.MetricsTLS().Enabled() && !IsLoopback(c.MetricsListen) {
		bad("lock.server.metrics-listen", "%q is not a loopback address and TLS is off: set lock.server.metrics-tls.cert-file and "+
			"lock.server.metrics-tls.key-file (or lock.server.insecure-allow-remote=true to serve plaintext anyway)", c.MetricsListen)
	}
}

// MetricsOff is the lock.server.metrics-listen value that disables the
// metrics listener (C5); lockd serve and lockd health read it too.
const MetricsOff = "off"

// IsLoopback reports whether the host of a host:port listen address is
// "localhost" or a loopback IP. An empty host, an unspecified address
// (0.0.0.0, ::) and every other host name count as remote: the check never
// resolves names.
func IsLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// TLSReloader serves one listener's certificate and client CA, re-read when
// the files change on disk (checked at every new handshake by modification
// time and size) or when Reload is called (SIGHUP). A change that fails to
// load keeps the previous certificate and CA and logs tls_reload_failed
// once; connections already open are never touched. It is safe for
// concurrent use. The reloading itself is internal/tlsreload's, shared
// with the etcd client's files (internal/backend).
type TLSReloader struct {
	files      TLSFiles
	listener   string // C4 listener label
	nextProtos []string
	cur        *tlsreload.Reloader[*tls.Config] // of load's configs
}

// NewTLSReloader loads files (an error names the key of the file that
// failed) and returns a reloader for them. listener is the C4 label
// (telemetry.ListenerGRPC or ListenerMetrics); nextProtos the ALPN
// protocols the listener speaks.
func NewTLSReloader(files TLSFiles, listener string, nextProtos []string, logger *slog.Logger) (*TLSReloader, error) {
	r := &TLSReloader{files: files, listener: listener, nextProtos: nextProtos}
	var err error
	r.cur, err = tlsreload.New(listener, []string{files.CertFile, files.KeyFile, files.ClientCAFile}, r.load, logger)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Config returns the listener's tls.Config: every handshake gets the
// current certificate and client CA through GetConfigForClient.
func (r *TLSReloader) Config() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		NextProtos:         r.nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return r.cur.Current(), nil },
	}
}

// Reload re-reads the files now, changed or not. On error the previous
// certificate and CA stay in force (and the error is logged as
// tls_reload_failed).
func (r *TLSReloader) Reload() error { return r.cur.Reload() }

// load reads the files into the config one handshake uses.
func (r *TLSReloader) load() (*tls.Config, error) {
	prefix := "lock.server.tls."
	if r.listener == telemetry.ListenerMetrics {
		prefix = "lock.server.metrics-tls."
	}
	cert, err := tls.LoadX509KeyPair(r.files.CertFile, r.files.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("%scert-file, %skey-file: %w", prefix, prefix, err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		NextProtos:   r.nextProtos,
		ClientAuth:   r.files.clientAuth(),
	}
	if r.files.ClientCAFile != "" {
		pem, err := os.ReadFile(r.files.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("%sclient-ca-file: %w", prefix, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%sclient-ca-file: %s holds no PEM certificate", prefix, r.files.ClientCAFile)
		}
		cfg.ClientCAs = pool
	}
	return cfg, nil
}

// PeerCertificate returns the verified client certificate of the call in
// ctx, or nil when the connection is plaintext or the client sent none
// (auth.PeerCertificate, from which the interceptor takes the caller's
// identity).
func PeerCertificate(ctx context.Context) *x509.Certificate { return auth.PeerCertificate(ctx) }

// tlsSetup builds the reloaders of both listeners (nil when a listener is
// plaintext) and logs insecure_listener for each non-loopback plaintext
// listener allowed by InsecureAllowRemote.
func (c Config) tlsSetup(logger *slog.Logger) (grpcTLS, metricsTLS, httpTLS *TLSReloader, err error) {
	if c.GRPCTLS().Enabled() {
		if grpcTLS, err = NewTLSReloader(c.GRPCTLS(), telemetry.ListenerGRPC, []string{"h2"}, logger); err != nil {
			return nil, nil, nil, err
		}
	} else if !IsLoopback(c.Listen) {
		telemetry.InsecureListener(logger, telemetry.ListenerGRPC, c.Listen, telemetry.InsecurePlaintext)
	}
	if c.MetricsTLS().Enabled() {
		if metricsTLS, err = NewTLSReloader(c.MetricsTLS(), telemetry.ListenerMetrics, []string{"http/1.1"}, logger); err != nil {
			return nil, nil, nil, err
		}
	} else if c.MetricsListen != MetricsOff && !IsLoopback(c.MetricsListen) {
		telemetry.InsecureListener(logger, telemetry.ListenerMetrics, c.MetricsListen, telemetry.InsecurePlaintext)
	}
	// The HTTP/JSON API serves the gRPC listener's files (C5 #ct5-http)
	// through a reloader of its own (ALPN http/1.1, listener label http).
	if c.HTTPListen != "" {
		if c.GRPCTLS().Enabled() {
			if httpTLS, err = NewTLSReloader(c.GRPCTLS(), telemetry.ListenerHTTP, []string{"http/1.1"}, logger); err != nil {
				return nil, nil, nil, err
			}
		} else if !IsLoopback(c.HTTPListen) {
			telemetry.InsecureListener(logger, telemetry.ListenerHTTP, c.HTTPListen, telemetry.InsecurePlaintext)
		}
	}
	return grpcTLS, metricsTLS, httpTLS, nil
}

// MetricsTLSConfig returns the tls.Config for the metrics listener
// (wrap it with tls.NewListener), or nil when it is plaintext.
func (s *Server) MetricsTLSConfig() *tls.Config {
	if s.metricsTLS == nil {
		return nil
	}
	return s.metricsTLS.Config()
}

// ReloadTLS re-reads the certificate, key and client CA files of every
// listener now (SIGHUP). Failures are logged and returned; the previous
// files stay in force.
func (s *Server) ReloadTLS() error {
	var errs []error
	for _, r := range []*TLSReloader{s.grpcTLS, s.metricsTLS, s.httpTLS} {
		if r != nil {
			errs = append(errs, r.Reload())
		}
	}
	return errors.Join(errs...)
}

// grpcCreds is the gRPC server's transport credentials option: TLS from the
// reloader, or none (plaintext).
func (s *Server) grpcCreds() []grpc.ServerOption {
	if s.grpcTLS == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(s.grpcTLS.Config()))}
}
