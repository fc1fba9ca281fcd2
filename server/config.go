package server

import (
	"errors"
	"fmt"
	"time"

	"lock.dev/lockd/store"
)

// Config holds the server's own keys of lockd's C5 configuration
// (docs/contracts/C5.md #ct5-config): one field per key, with the key in the
// koanf tag. The backend's keys (lock.backend, lock.etcd.*, lock.pg.*,
// lock.embedded.*) are not here: the server runs over whatever store it is
// given.
type Config struct {
	// SessionTTL is lock.session.ttl: the TTL of sessions opened without one.
	SessionTTL time.Duration `koanf:"lock.session.ttl"`
	// SafetyMargin is lock.client.safety-margin: how long before the
	// backend could free a key a client stops trusting its lock. The server
	// advertises it to clients and requires TTLs above twice it.
	SafetyMargin time.Duration `koanf:"lock.client.safety-margin"`
	// HeartbeatInterval is lock.client.heartbeat-interval, advertised to
	// clients; 0 means TTL/3.
	HeartbeatInterval time.Duration `koanf:"lock.client.heartbeat-interval"`
	// Listen is lock.server.listen, the gRPC address.
	Listen string `koanf:"lock.server.listen"`
	// MetricsListen is lock.server.metrics-listen (/metrics, /healthz).
	MetricsListen string `koanf:"lock.server.metrics-listen"`
	// CloseSessionsOnShutdown is lock.server.close-sessions-on-shutdown: on
	// SIGINT/SIGTERM, close every session (releasing its locks at once)
	// instead of leaving them to expire.
	CloseSessionsOnShutdown bool `koanf:"lock.server.close-sessions-on-shutdown"`

	// Transport security (C5 #ct5-tls; tls.go): the gRPC listener's TLS
	// (lock.server.tls.*), the metrics listener's (lock.server.metrics-tls.*)
	// and the loopback rule's escape hatch.
	TLSCertFile            string `koanf:"lock.server.tls.cert-file"`
	TLSKeyFile             string `koanf:"lock.server.tls.key-file"`
	TLSClientCAFile        string `koanf:"lock.server.tls.client-ca-file"`
	TLSClientAuth          string `koanf:"lock.server.tls.client-auth"`
	MetricsTLSCertFile     string `koanf:"lock.server.metrics-tls.cert-file"`
	MetricsTLSKeyFile      string `koanf:"lock.server.metrics-tls.key-file"`
	MetricsTLSClientCAFile string `koanf:"lock.server.metrics-tls.client-ca-file"`
	MetricsTLSClientAuth   string `koanf:"lock.server.metrics-tls.client-auth"`
	// InsecureAllowRemote is lock.server.insecure-allow-remote: serve
	// plaintext on a non-loopback address (logged at every start).
	InsecureAllowRemote bool `koanf:"lock.server.insecure-allow-remote"`
}

// DefaultConfig returns the C5 defaults.
func DefaultConfig() Config {
	return Config{
		SessionTTL:    15 * time.Second,
		SafetyMargin:  2 * time.Second,
		Listen:        "127.0.0.1:7420",
		MetricsListen: "127.0.0.1:7421",
	}
}

// Validate checks every bound and cross-field rule of C5 for the server's
// keys. Each error is "key: message", one per problem, joined.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if err := store.ValidateTTL(c.SessionTTL); err != nil {
		bad("lock.session.ttl", "%v is out of bounds [%v, %v] or not whole milliseconds", c.SessionTTL, store.MinTTL, store.MaxTTL)
	}
	if c.SafetyMargin <= 0 || c.SafetyMargin >= c.SessionTTL/2 {
		bad("lock.client.safety-margin", "%v must be > 0 and < lock.session.ttl/2 (%v)", c.SafetyMargin, c.SessionTTL/2)
	}
	if hb := c.HeartbeatInterval; hb != 0 && (hb < 100*time.Millisecond || hb > c.SessionTTL-2*c.SafetyMargin) {
		bad("lock.client.heartbeat-interval", "%v must be 0 (ttl/3) or in [100ms, ttl - 2×safety-margin = %v]", hb, c.SessionTTL-2*c.SafetyMargin)
	}
	if c.Listen == "" {
		bad("lock.server.listen", "must not be empty")
	}
	if c.MetricsListen == "" {
		bad("lock.server.metrics-listen", "must not be empty (use \"off\" to disable)")
	}
	c.GRPCTLS().validate("lock.server.tls.", bad)
	c.MetricsTLS().validate("lock.server.metrics-tls.", bad)
	c.validateListeners(bad)
	return errors.Join(errs...)
}
