package server

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"lock.dev/lockd/store"
)

// Backend names (C5 lock.backend).
const (
	BackendEmbedded = "embedded"
	BackendEtcd     = "etcd"
	BackendPG       = "pg"
)

// Config is lockd's configuration: one field per C5 key
// (docs/contracts/C5.md #ct5-config), with the key in the koanf tag.
type Config struct {
	// Backend is lock.backend: embedded, etcd or pg.
	Backend string `koanf:"lock.backend"`
	// SessionTTL is lock.session.ttl: the TTL of sessions opened without one.
	SessionTTL time.Duration `koanf:"lock.session.ttl"`
	// SafetyMargin is lock.client.safety-margin: how long before the
	// backend could free a key a client stops trusting its lock.
	SafetyMargin time.Duration `koanf:"lock.client.safety-margin"`
	// HeartbeatInterval is lock.client.heartbeat-interval; 0 means TTL/3.
	HeartbeatInterval time.Duration `koanf:"lock.client.heartbeat-interval"`
	// Listen is lock.server.listen, the gRPC address.
	Listen string `koanf:"lock.server.listen"`
	// MetricsListen is lock.server.metrics-listen (/metrics, /healthz).
	MetricsListen string `koanf:"lock.server.metrics-listen"`
	// CloseSessionsOnShutdown is lock.server.close-sessions-on-shutdown: on
	// SIGINT/SIGTERM, close every session (releasing its locks at once)
	// instead of leaving them to expire.
	CloseSessionsOnShutdown bool `koanf:"lock.server.close-sessions-on-shutdown"`
	// EtcdEndpoints is lock.etcd.endpoints (backend etcd).
	EtcdEndpoints []string `koanf:"lock.etcd.endpoints"`
	// EtcdPrefix is lock.etcd.prefix: every key lockd writes starts with it.
	EtcdPrefix string `koanf:"lock.etcd.prefix"`
	// EtcdDialTimeout is lock.etcd.dial-timeout.
	EtcdDialTimeout time.Duration `koanf:"lock.etcd.dial-timeout"`
	// PGDSN is lock.pg.dsn (backend pg).
	PGDSN string `koanf:"lock.pg.dsn"`
	// PGSchema is lock.pg.schema.
	PGSchema string `koanf:"lock.pg.schema"`
	// PGReaperInterval is lock.pg.reaper-interval.
	PGReaperInterval time.Duration `koanf:"lock.pg.reaper-interval"`
	// EmbeddedDataDir is lock.embedded.data-dir (backend embedded).
	EmbeddedDataDir string `koanf:"lock.embedded.data-dir"`
}

// DefaultConfig returns the C5 defaults.
func DefaultConfig() Config {
	return Config{
		Backend:          BackendEmbedded,
		SessionTTL:       15 * time.Second,
		SafetyMargin:     2 * time.Second,
		Listen:           "127.0.0.1:7420",
		MetricsListen:    "127.0.0.1:7421",
		EtcdPrefix:       "/lockd/",
		EtcdDialTimeout:  5 * time.Second,
		PGSchema:         "lockd",
		PGReaperInterval: time.Second,
		EmbeddedDataDir:  "./lockd-data",
	}
}

// EffectiveHeartbeatInterval is HeartbeatInterval, or SessionTTL/3 when unset.
func (c Config) EffectiveHeartbeatInterval() time.Duration {
	if c.HeartbeatInterval > 0 {
		return c.HeartbeatInterval
	}
	return c.SessionTTL / 3
}

// Validate checks every bound and cross-field rule of C5. Each error names
// the key it is about.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	switch c.Backend {
	case BackendEmbedded, BackendEtcd, BackendPG:
	default:
		bad("lock.backend", "%q is not one of embedded, etcd, pg", c.Backend)
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
	if c.Backend == BackendEtcd && len(c.EtcdEndpoints) == 0 {
		bad("lock.etcd.endpoints", "must name at least one endpoint when lock.backend=etcd")
	}
	if c.EtcdPrefix == "" || !strings.HasSuffix(c.EtcdPrefix, "/") {
		bad("lock.etcd.prefix", "%q must be non-empty and end with /", c.EtcdPrefix)
	}
	if c.EtcdDialTimeout < 100*time.Millisecond || c.EtcdDialTimeout > time.Minute {
		bad("lock.etcd.dial-timeout", "%v out of bounds [100ms, 1m]", c.EtcdDialTimeout)
	}
	if c.Backend == BackendPG && c.PGDSN == "" {
		bad("lock.pg.dsn", "must be set when lock.backend=pg")
	}
	if !validIdent(c.PGSchema) {
		bad("lock.pg.schema", "%q must be a lower-case SQL identifier ([a-z_][a-z0-9_]*, at most 63 bytes)", c.PGSchema)
	}
	if c.PGReaperInterval < 100*time.Millisecond || c.PGReaperInterval > time.Minute {
		bad("lock.pg.reaper-interval", "%v out of bounds [100ms, 1m]", c.PGReaperInterval)
	}
	if c.Backend == BackendEmbedded && c.EmbeddedDataDir == "" {
		bad("lock.embedded.data-dir", "must not be empty when lock.backend=embedded")
	}
	return errors.Join(errs...)
}

func validIdent(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_', r >= 'a' && r <= 'z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
