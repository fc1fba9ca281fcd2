package server

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"lock.dev/lockd/server/internal/prefixstats"
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
	// HTTPListen is lock.server.http.listen, the HTTP/JSON API's address
	// (C5 #ct5-http); empty: off. Its TLS is the gRPC listener's.
	HTTPListen string `koanf:"lock.server.http.listen"`
	// HTTPConsole is lock.server.http.console: serve the read-only web
	// console under /console/ on HTTPListen (C5 #ct5-console).
	HTTPConsole bool `koanf:"lock.server.http.console"`
	// StatsTemplates is lock.server.stats.templates: the key templates of
	// the per-template statistics (C5 #ct5-stats, C4 #ct4-template-stats);
	// empty: the key's first path segment.
	StatsTemplates []string `koanf:"lock.server.stats.templates"`
	// StatsEnabled is lock.server.stats.enabled: keep the per-template
	// statistics and the hot keys (C5 #ct5-stats); false: neither.
	StatsEnabled bool `koanf:"lock.server.stats.enabled"`
	// Tracing* are lock.server.tracing.* (C5 #ct5-tracing): OpenTelemetry
	// traces exported over OTLP, off by default.
	TracingEnabled      bool    `koanf:"lock.server.tracing.enabled"`
	TracingOTLPEndpoint string  `koanf:"lock.server.tracing.otlp-endpoint"`
	TracingOTLPProtocol string  `koanf:"lock.server.tracing.otlp-protocol"`
	TracingOTLPInsecure bool    `koanf:"lock.server.tracing.otlp-insecure"`
	TracingOTLPCAFile   string  `koanf:"lock.server.tracing.otlp-ca-file"`
	TracingSampleRatio  float64 `koanf:"lock.server.tracing.sample-ratio"`
	// CloseSessionsOnShutdown is lock.server.close-sessions-on-shutdown: on
	// SIGINT/SIGTERM, close every session (releasing its locks at once)
	// instead of leaving them to expire.
	CloseSessionsOnShutdown bool `koanf:"lock.server.close-sessions-on-shutdown"`
	// DrainTimeout is lock.server.drain-timeout: without
	// CloseSessionsOnShutdown, how long Shutdown drains (tells attached
	// clients to move and waits for their KeepAlive streams to end) before
	// it stops, ending no session (C2 #ct2-drain). 0 skips the drain.
	DrainTimeout time.Duration `koanf:"lock.server.drain-timeout"`

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
	// Limits (C5 #ct5-limits, C2 #ct2-limits): what clients can make this
	// server hold. Exceeding one is RESOURCE_EXHAUSTED, reason LIMIT.

	// MaxTTL is lock.session.max-ttl: the longest session TTL a client may
	// ask for.
	MaxTTL time.Duration `koanf:"lock.session.max-ttl"`
	// MaxSessions is lock.server.max-sessions: sessions this server keeps
	// (open, closing or being opened). On etcd each is a lease the store
	// keeps alive: this bounds the keepalive load.
	MaxSessions int `koanf:"lock.server.max-sessions"`
	// MaxSessionOpens is lock.server.max-session-opens: OpenSession calls
	// in progress at once; more are refused, not queued.
	MaxSessionOpens int `koanf:"lock.server.max-session-opens"`
	// MaxConnections is lock.server.max-connections: client connections
	// whose RPCs are served.
	MaxConnections int `koanf:"lock.server.max-connections"`
	// MaxStreams is lock.server.max-streams: KeepAlive and Watch streams
	// open at once.
	MaxStreams int `koanf:"lock.server.max-streams"`
	// MaxWatches is lock.server.max-watches: Watch streams open at once.
	MaxWatches int `koanf:"lock.server.max-watches"`
	// MaxWaiters is lock.server.max-waiters: acquires waiting at once.
	MaxWaiters int `koanf:"lock.server.max-waiters"`
	// MaxWaitersPerKey is lock.server.max-waiters-per-key: acquires
	// waiting at once for one key.
	MaxWaitersPerKey int `koanf:"lock.server.max-waiters-per-key"`
	// MaxLocksPerSession is lock.server.max-locks-per-session: grants made
	// through this server plus acquires in progress, per session.
	MaxLocksPerSession int `koanf:"lock.server.max-locks-per-session"`
	// RefusalRate is lock.server.refusal-rate: calls per second one peer
	// gets refused for access before further refusals are answered LIMIT
	// refusals (C2 #ct2-limits); 0 is off.
	RefusalRate int `koanf:"lock.server.refusal-rate"`
	// MaxLockDelay is lock.server.max-lock-delay: the longest lock-delay an
	// Acquire may ask for (C2 #ct2-delay); 0 refuses every lock-delay.
	MaxLockDelay time.Duration `koanf:"lock.server.max-lock-delay"`
	// MaxHoldLimit is lock.server.max-hold-limit: the longest maximum hold
	// an Acquire may ask for (C2 #ct2-delay); 0 refuses every maximum hold.
	MaxHoldLimit time.Duration `koanf:"lock.server.max-hold-limit"`

	// Idle and unauthorised connections (C5 #ct5-idle; idle.go).

	// ConnAuthTimeout is lock.server.conn-auth-timeout: a client connection
	// that has made no authorised call this long after it was accepted is
	// closed.
	ConnAuthTimeout time.Duration `koanf:"lock.server.conn-auth-timeout"`
	// IdleTimeout is lock.server.idle-timeout: a client connection with no
	// call in progress this long is closed.
	IdleTimeout time.Duration `koanf:"lock.server.idle-timeout"`
	// HTTPReadHeaderTimeout is lock.server.http.read-header-timeout: the
	// bound of an HTTP request's headers and of the TLS handshake.
	HTTPReadHeaderTimeout time.Duration `koanf:"lock.server.http.read-header-timeout"`

	// Per-principal shares (C5 #ct5-principal-limits; principal_limits.go),
	// applied while an access policy is in force; 0 is 25 % of the global
	// bound (at least 1).

	// PrincipalMaxStreams is lock.server.principal.max-streams.
	PrincipalMaxStreams int `koanf:"lock.server.principal.max-streams"`
	// PrincipalMaxWatches is lock.server.principal.max-watches.
	PrincipalMaxWatches int `koanf:"lock.server.principal.max-watches"`
	// PrincipalMaxSessions is lock.server.principal.max-sessions.
	PrincipalMaxSessions int `koanf:"lock.server.principal.max-sessions"`
	// PrincipalMaxConnections is lock.server.principal.max-connections.
	PrincipalMaxConnections int `koanf:"lock.server.principal.max-connections"`
	// PrincipalMaxWaiters is lock.server.principal.max-waiters.
	PrincipalMaxWaiters int `koanf:"lock.server.principal.max-waiters"`
	// PrincipalMaxInflight is lock.server.principal.max-inflight (0: 4 ×
	// max-connections, a quarter of max-connections × 16).
	PrincipalMaxInflight int `koanf:"lock.server.principal.max-inflight"`
	// PrincipalMaxSessionOpens is lock.server.principal.max-session-opens
	// (OpenSession calls per second).
	PrincipalMaxSessionOpens int `koanf:"lock.server.principal.max-session-opens"`
}

// MaxLimit is the upper bound of every lock.server.max-* key.
const MaxLimit = 1_000_000

// DefaultConfig returns the C5 defaults.
func DefaultConfig() Config {
	return Config{
		SessionTTL:    15 * time.Second,
		SafetyMargin:  2 * time.Second,
		Listen:        "127.0.0.1:7420",
		MetricsListen: "127.0.0.1:7421",
		DrainTimeout:  5 * time.Second,
		StatsEnabled:  true,

		TracingOTLPProtocol: TracingGRPC,
		TracingSampleRatio:  1,

		MaxTTL:             store.MaxTTL,
		MaxSessions:        10000,
		MaxSessionOpens:    64,
		MaxConnections:     1024,
		MaxStreams:         2048,
		MaxWatches:         256,
		MaxWaiters:         4096,
		MaxWaitersPerKey:   256,
		MaxLocksPerSession: 1024,
		RefusalRate:        10,
		MaxLockDelay:       time.Minute,
		MaxHoldLimit:       24 * time.Hour,

		ConnAuthTimeout:       10 * time.Second,
		IdleTimeout:           2 * time.Minute,
		HTTPReadHeaderTimeout: 10 * time.Second,
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
	if c.HTTPConsole && c.HTTPListen == "" {
		bad("lock.server.http.console", "needs lock.server.http.listen (the console is served on the HTTP/JSON API listener)")
	}
	if d := c.DrainTimeout; d != 0 && (d < 100*time.Millisecond || d > time.Minute) {
		bad("lock.server.drain-timeout", "%v must be 0 (no drain) or in [100ms, 1m]", d)
	}
	c.GRPCTLS().validate("lock.server.tls.", bad)
	c.MetricsTLS().validate("lock.server.metrics-tls.", bad)
	c.validateListeners(bad)
	c.validateLimits(bad)
	c.validateTracing(bad)
	if err := prefixstats.Validate(c.StatsTemplates); err != nil {
		bad("lock.server.stats.templates", "%v", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if d := c.MaxLockDelay; d < 0 || d > store.MaxLockDelay || d%time.Millisecond != 0 {
		bad("lock.server.max-lock-delay", "%v must be whole milliseconds in [0, %v]", d, store.MaxLockDelay)
	}
	if d := c.MaxHoldLimit; d != 0 && (d < store.MinMaxHold || d > store.MaxMaxHold) || d%time.Millisecond != 0 {
		bad("lock.server.max-hold-limit", "%v must be 0 or whole milliseconds in [%v, %v]", d, store.MinMaxHold, store.MaxMaxHold)
	}
	for _, d := range []struct {
		key      string
		v        time.Duration
		min, max time.Duration
	}{
		{"lock.server.conn-auth-timeout", c.ConnAuthTimeout, time.Second, 10 * time.Minute},
		{"lock.server.idle-timeout", c.IdleTimeout, 10 * time.Second, 24 * time.Hour},
		{"lock.server.http.read-header-timeout", c.HTTPReadHeaderTimeout, time.Second, time.Minute},
	} {
		if d.v < d.min || d.v > d.max || d.v%time.Millisecond != 0 {
			bad(d.key, "%v must be whole milliseconds in [%v, %v]", d.v, d.min, d.max)
		}
	}
	return errors.Join(errs...)
}

// validateLimits checks the limit keys (#ct5-limits).
func (c Config) validateLimits(bad func(key, format string, args ...any)) {
	if store.ValidateTTL(c.MaxTTL) != nil || c.MaxTTL < c.SessionTTL {
		bad("lock.session.max-ttl", "%v must be whole milliseconds in [lock.session.ttl (%v), %v]", c.MaxTTL, c.SessionTTL, store.MaxTTL)
	}
	for _, l := range []struct {
		key      string
		v, upper int
		upperKey string
	}{
		{"lock.server.max-sessions", c.MaxSessions, MaxLimit, ""},
		{"lock.server.max-session-opens", c.MaxSessionOpens, MaxLimit, ""},
		{"lock.server.max-connections", c.MaxConnections, MaxLimit, ""},
		{"lock.server.max-streams", c.MaxStreams, MaxLimit, ""},
		{"lock.server.max-watches", c.MaxWatches, c.MaxStreams, "lock.server.max-streams"},
		{"lock.server.max-waiters", c.MaxWaiters, MaxLimit, ""},
		{"lock.server.max-waiters-per-key", c.MaxWaitersPerKey, c.MaxWaiters, "lock.server.max-waiters"},
		{"lock.server.max-locks-per-session", c.MaxLocksPerSession, MaxLimit, ""},
	} {
		switch {
		case l.v < 1 || l.v > MaxLimit:
			bad(l.key, "%d out of bounds [1, %d]", l.v, MaxLimit)
		case l.v > l.upper:
			bad(l.key, "%d must not exceed %s (%d)", l.v, l.upperKey, l.upper)
		}
	}
	for _, l := range []struct {
		key string
		v   int
	}{
		{"lock.server.principal.max-streams", c.PrincipalMaxStreams},
		{"lock.server.principal.max-watches", c.PrincipalMaxWatches},
		{"lock.server.principal.max-sessions", c.PrincipalMaxSessions},
		{"lock.server.principal.max-connections", c.PrincipalMaxConnections},
		{"lock.server.principal.max-waiters", c.PrincipalMaxWaiters},
		{"lock.server.principal.max-inflight", c.PrincipalMaxInflight},
		{"lock.server.principal.max-session-opens", c.PrincipalMaxSessionOpens},
	} {
		if l.v < 0 || l.v > MaxLimit {
			bad(l.key, "%d out of bounds [0 (25 %% of the global bound), %d]", l.v, MaxLimit)
		}
	}
	if c.RefusalRate < 0 || c.RefusalRate > MaxLimit {
		bad("lock.server.refusal-rate", "%d out of bounds [0 (off), %d]", c.RefusalRate, MaxLimit)
	}
}
