package backend

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/grpc/credentials"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/tlsreload"
)

// validateSecurity checks the transport security keys (C5 #ct5-tls).
func (c Config) validateSecurity(bad func(key, format string, args ...any)) {
	etcdTLS := c.EtcdTLSCAFile != "" || c.EtcdTLSCertFile != "" || c.EtcdTLSKeyFile != ""
	if c.Kind != Etcd {
		for _, k := range []struct{ key, v string }{
			{"lock.etcd.tls.ca-file", c.EtcdTLSCAFile}, {"lock.etcd.tls.cert-file", c.EtcdTLSCertFile},
			{"lock.etcd.tls.key-file", c.EtcdTLSKeyFile}, {"lock.etcd.username", c.EtcdUsername},
			{"lock.etcd.password-file", c.EtcdPasswordFile},
		} {
			if k.v != "" {
				bad(k.key, "applies only to lock.backend=etcd (the embedded etcd is reached over a private unix socket)")
			}
		}
		return
	}
	if (c.EtcdTLSCertFile == "") != (c.EtcdTLSKeyFile == "") {
		bad("lock.etcd.tls.cert-file", "lock.etcd.tls.cert-file and lock.etcd.tls.key-file must be set together")
	}
	if (c.EtcdUsername == "") != (c.EtcdPasswordFile == "") {
		bad("lock.etcd.username", "lock.etcd.username and lock.etcd.password-file must be set together")
	}
	if etcdTLS {
		for _, ep := range c.EtcdEndpoints {
			if !strings.HasPrefix(ep, "https://") {
				bad("lock.etcd.endpoints", "%q must be an https:// URL when lock.etcd.tls.* is set", ep)
			}
		}
	}
}

func (c Config) validatePGSecrets(bad func(key, format string, args ...any)) {
	if c.PGDSN != "" && c.PGDSNFile != "" {
		bad("lock.pg.dsn-file", "set lock.pg.dsn or lock.pg.dsn-file, not both")
	}
}

// loadEtcdTLS reads the lock.etcd.tls.* files into the TLS config of one
// handshake with etcd; an error names the key.
func (c Config) loadEtcdTLS() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.EtcdTLSCAFile != "" {
		pem, err := os.ReadFile(c.EtcdTLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("lock.etcd.tls.ca-file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("lock.etcd.tls.ca-file: %s holds no PEM certificate", c.EtcdTLSCAFile)
		}
	}
	if c.EtcdTLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.EtcdTLSCertFile, c.EtcdTLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("lock.etcd.tls.cert-file, lock.etcd.tls.key-file: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// etcdTLS returns the reloader of the lock.etcd.tls.* files (C5 #ct5-tls:
// re-read when they change, checked at each new handshake, and on
// Backend.ReloadTLS), or nil when they are unset. logger receives the
// reload events (listener etcd, C4).
func (c Config) etcdTLS(logger *slog.Logger) (*tlsreload.Reloader[*tls.Config], error) {
	if c.EtcdTLSCAFile == "" && c.EtcdTLSCertFile == "" {
		return nil, nil
	}
	return tlsreload.New(telemetry.ListenerEtcd, []string{c.EtcdTLSCertFile, c.EtcdTLSKeyFile, c.EtcdTLSCAFile},
		c.loadEtcdTLS, logger)
}

// etcdCreds are the etcd client's gRPC transport credentials: TLS whose
// every handshake uses the lock.etcd.tls.* files in force (client
// certificate and CA bundle alike). crypto/tls has no per-handshake hook
// for a client's roots, so each handshake gets a TLS config of its own and
// crypto/tls's usual verification (chain, server name, usage).
type etcdCreds struct {
	files *tlsreload.Reloader[*tls.Config]
}

var _ credentials.TransportCredentials = etcdCreds{}

// ClientHandshake makes a TLS handshake with the files in force now.
func (c etcdCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.files.Current()).ClientHandshake(ctx, authority, conn)
}

// ServerHandshake is not used: these credentials only dial.
func (etcdCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("backend: etcd client credentials cannot serve")
}

// Info is TLS's, with no server name override (lock.etcd.tls.* sets
// none). It does not look at the files: only a handshake reloads them.
func (etcdCreds) Info() credentials.ProtocolInfo { return credentials.NewTLS(nil).Info() }

// Clone returns c: it holds nothing but the shared reloader.
func (c etcdCreds) Clone() credentials.TransportCredentials { return c }

// OverrideServerName is deprecated in gRPC and unused by clientv3.
func (etcdCreds) OverrideServerName(string) error { return nil }

// readSecret reads a secret file (one trailing newline dropped). Errors name
// the key and the file, never the content.
func readSecret(key, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", fmt.Errorf("%s: %s is empty", key, path)
	}
	return s, nil
}

// pgDSN returns lock.pg.dsn, or the content of lock.pg.dsn-file.
func (c Config) pgDSN() (string, error) {
	if c.PGDSNFile != "" {
		return readSecret("lock.pg.dsn-file", c.PGDSNFile)
	}
	return c.PGDSN, nil
}

// checkPGTLS logs pg_tls_weak for each non-local host of dsn reached with an
// sslmode weaker than verify-full. A DSN that does not parse is left to the
// store to report.
func checkPGTLS(dsn string, logger *slog.Logger) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return
	}
	level := map[string]string{} // host → weakest level seen
	order := []string{}
	note := func(host string, t *tls.Config) {
		l := ""
		switch {
		case t == nil:
			l = telemetry.PGTLSOptional
		case t.InsecureSkipVerify:
			l = telemetry.PGTLSUnverified
		}
		if _, seen := level[host]; !seen {
			order = append(order, host)
			level[host] = l
		}
		if l == telemetry.PGTLSOptional || level[host] == "" {
			level[host] = l
		}
	}
	note(cfg.Host, cfg.TLSConfig)
	for _, fb := range cfg.Fallbacks {
		note(fb.Host, fb.TLSConfig)
	}
	for _, host := range order {
		if l := level[host]; l != "" && !localHost(host) {
			telemetry.PGTLSWeak(logger, host, l)
		}
	}
}

// localHost: a unix socket directory, localhost or a loopback IP.
func localHost(host string) bool {
	if strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// pgPassword finds the password in dsn, for redaction: parsed by pgx when it
// parses, else taken from a URL's user info or a password= setting.
func pgPassword(dsn string) string {
	if cfg, err := pgconn.ParseConfig(dsn); err == nil {
		return cfg.Password
	}
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok {
			return p
		}
	}
	if m := passwordKV.FindStringSubmatch(dsn); m != nil {
		return strings.Trim(m[1], "'")
	}
	return ""
}

var passwordKV = regexp.MustCompile(`password\s*=\s*('[^']*'|\S+)`)

// redactedError hides secrets in an error's text; errors.Is and As still
// see the wrapped chain.
type redactedError struct {
	err     error
	secrets []string
}

func (e *redactedError) Error() string {
	s := e.err.Error()
	for _, secret := range e.secrets {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "xxxxx")
		}
	}
	return s
}

func (e *redactedError) Unwrap() error { return e.err }

// redact wraps err so its text never shows the secrets.
func redact(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	var re *redactedError
	if errors.As(err, &re) {
		secrets = append(secrets, re.secrets...)
	}
	return &redactedError{err: err, secrets: secrets}
}
