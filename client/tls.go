package client

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Transport security
//
// A Client speaks plaintext by default only to a loopback target
// ("localhost", 127.0.0.0/8, ::1, or a unix socket). For any other target
// New needs one of WithTLS, WithTLSFiles or WithTransportCredentials — or
// WithInsecure, which sends the session's traffic in the clear on purpose.
// A target whose address New cannot see (a custom resolver scheme) counts
// as remote.

// transportOptions are the options that choose the connection's security.
type transportOptions struct {
	creds    credentials.TransportCredentials
	files    *[3]string // ca, cert, key of WithTLSFiles
	insecure bool
	count    int // how many of the options above were given
}

// WithTLS connects over TLS with cfg (a nil cfg means the system roots and
// no client certificate). Set cfg.Certificates for mutual TLS and
// cfg.ServerName when the target's host is not a name in the server's
// certificate.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) {
		if cfg == nil {
			cfg = &tls.Config{}
		}
		o.transport.creds = credentials.NewTLS(cfg)
		o.transport.count++
	}
}

// WithTLSFiles connects over TLS, trusting the PEM CA bundle in caFile
// (empty: the system roots) and, when certFile and keyFile are set,
// presenting that client certificate (mutual TLS). New reads the files and
// fails if they do not load.
func WithTLSFiles(caFile, certFile, keyFile string) Option {
	return func(o *options) {
		o.transport.files = &[3]string{caFile, certFile, keyFile}
		o.transport.count++
	}
}

// WithTransportCredentials connects with any gRPC transport credentials.
func WithTransportCredentials(c credentials.TransportCredentials) Option {
	return func(o *options) {
		o.transport.creds = c
		o.transport.count++
	}
}

// WithInsecure allows plaintext to a target that is not on loopback:
// anyone on the path can read and alter the traffic, session ids
// included. Without a TLS option, plaintext is the default only for
// loopback targets.
func WithInsecure() Option {
	return func(o *options) {
		o.transport.insecure = true
		o.transport.count++
	}
}

// TLSConfigFromFiles builds a client tls.Config: the PEM CA bundle in
// caFile (empty: the system roots), the client certificate in certFile and
// keyFile (both empty: none) and the name to verify in the server's
// certificate (empty: the target's host).
func TLSConfigFromFiles(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%w: tls ca: %w", ErrInvalidArgument, err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: tls ca: %s holds no PEM certificate", ErrInvalidArgument, caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("%w: tls: a client certificate needs both its certificate and its key file", ErrInvalidArgument)
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: tls client certificate: %w", ErrInvalidArgument, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// credentials returns the transport credentials for target.
func (t transportOptions) credentials(target string) (credentials.TransportCredentials, error) {
	switch {
	case t.count > 1:
		return nil, fmt.Errorf("%w: give one of WithTLS, WithTLSFiles, WithTransportCredentials and WithInsecure", ErrInvalidArgument)
	case t.creds != nil:
		return t.creds, nil
	case t.files != nil:
		cfg, err := TLSConfigFromFiles(t.files[0], t.files[1], t.files[2], "")
		if err != nil {
			return nil, err
		}
		return credentials.NewTLS(cfg), nil
	case t.insecure || loopbackTarget(target):
		return insecure.NewCredentials(), nil
	}
	return nil, fmt.Errorf("%w: target %q is not a loopback address: connect with WithTLS or WithTLSFiles, "+
		"or pass WithInsecure to send plaintext over the network", ErrInvalidArgument, target)
}

// loopbackTarget reports whether a gRPC target names a loopback address or
// a unix socket: "host:port", "dns:///host:port", "dns://resolver/host:port",
// "passthrough:///host:port", "unix:...". Anything else counts as remote.
func loopbackTarget(target string) bool {
	if strings.HasPrefix(target, "unix:") || strings.HasPrefix(target, "unix-abstract:") {
		return true
	}
	addr := target
	if scheme, rest, ok := strings.Cut(target, "://"); ok {
		if scheme != "dns" && scheme != "passthrough" {
			return false
		}
		_, addr, _ = strings.Cut(rest, "/") // drop the authority
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
