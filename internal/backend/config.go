package backend

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"lock.dev/lockd/store/pgstore"
)

// Backend kinds (C5 lock.backend).
const (
	Embedded = "embedded"
	Etcd     = "etcd"
	PG       = "pg"
)

// Config is the backend part of the C5 configuration
// (docs/contracts/C5.md #ct5-config): one field per key, the key in the
// koanf tag.
type Config struct {
	// Kind is lock.backend: Embedded, Etcd or PG.
	Kind string `koanf:"lock.backend"`
	// EtcdEndpoints is lock.etcd.endpoints (backend etcd).
	EtcdEndpoints []string `koanf:"lock.etcd.endpoints"`
	// EtcdPrefix is lock.etcd.prefix: every key lockd writes starts with it
	// (backends etcd and embedded).
	EtcdPrefix string `koanf:"lock.etcd.prefix"`
	// EtcdDialTimeout is lock.etcd.dial-timeout: it bounds connecting to
	// etcd and opening the store.
	EtcdDialTimeout time.Duration `koanf:"lock.etcd.dial-timeout"`
	// EtcdAutoSyncInterval is lock.etcd.auto-sync-interval (backend etcd,
	// C5 #ct5-etcd-members): how often the etcd client replaces its
	// endpoints with the cluster's member list; 0 keeps EtcdEndpoints.
	EtcdAutoSyncInterval time.Duration `koanf:"lock.etcd.auto-sync-interval"`
	// PGDSN is lock.pg.dsn (backend pg).
	PGDSN string `koanf:"lock.pg.dsn"`

	// Transport security of the external backends (C5 #ct5-tls; tls.go).
	EtcdTLSCAFile    string `koanf:"lock.etcd.tls.ca-file"`
	EtcdTLSCertFile  string `koanf:"lock.etcd.tls.cert-file"`
	EtcdTLSKeyFile   string `koanf:"lock.etcd.tls.key-file"`
	EtcdUsername     string `koanf:"lock.etcd.username"`
	EtcdPasswordFile string `koanf:"lock.etcd.password-file"`
	// PGDSNFile is lock.pg.dsn-file: a file holding the DSN, instead of
	// lock.pg.dsn.
	PGDSNFile string `koanf:"lock.pg.dsn-file"`
	// PGSchema is lock.pg.schema.
	PGSchema string `koanf:"lock.pg.schema"`
	// PGReaperInterval is lock.pg.reaper-interval.
	PGReaperInterval time.Duration `koanf:"lock.pg.reaper-interval"`
	// PGMaxConns is lock.pg.max-conns: the size of the store's connection
	// pool (C5 #ct5-pg-pool); 0 leaves it to the DSN's pool_max_conns.
	PGMaxConns int `koanf:"lock.pg.max-conns"`
	// EmbeddedDataDir is lock.embedded.data-dir (backend embedded).
	EmbeddedDataDir string `koanf:"lock.embedded.data-dir"`
	// EmbeddedQuotaBytes is lock.embedded.quota-bytes: the embedded etcd's
	// backend quota (C5 #ct5-storage).
	EmbeddedQuotaBytes int64 `koanf:"lock.embedded.quota-bytes"`
	// EmbeddedCompactionRetainRevisions is
	// lock.embedded.compaction-retain-revisions: the embedded etcd is
	// compacted every 10 s to the current revision minus this many (or
	// fully, above half the quota in use); 0 only keeps etcd's hourly
	// compaction and the space rule.
	EmbeddedCompactionRetainRevisions int64 `koanf:"lock.embedded.compaction-retain-revisions"`
}

// Bounds of the embedded etcd's storage keys (C5).
const (
	DefaultEmbeddedQuotaBytes = 2 << 30 // etcd's default
	MinEmbeddedQuotaBytes     = 16 << 20
	MaxEmbeddedQuotaBytes     = 8 << 30 // etcd's suggested maximum

	DefaultCompactionRetainRevisions = 10_000
	MinCompactionRetainRevisions     = 1_000
	MaxCompactionRetainRevisions     = 1_000_000_000
)

// lock.pg.max-conns (C5 #ct5-pg-pool): group commit keeps up to four
// statements of the store in flight besides opens, closes, waits, reads and
// the reaper; pgxpool's own default, max(4, CPUs), is 4 on a 2-core host.
const (
	DefaultPGMaxConns = 16
	MaxPGMaxConns     = 1000
)

// Bounds of lock.etcd.auto-sync-interval (C5 #ct5-etcd-members): 0 is off.
const (
	DefaultEtcdAutoSyncInterval = 30 * time.Second
	MinEtcdAutoSyncInterval     = time.Second
	MaxEtcdAutoSyncInterval     = time.Hour
)

// DefaultConfig returns the C5 defaults.
func DefaultConfig() Config {
	return Config{
		Kind:                 Embedded,
		EtcdPrefix:           "/lockd/",
		EtcdDialTimeout:      5 * time.Second,
		EtcdAutoSyncInterval: DefaultEtcdAutoSyncInterval,
		PGSchema:             pgstore.DefaultSchema,
		PGReaperInterval:     pgstore.DefaultReaperInterval,
		PGMaxConns:           DefaultPGMaxConns,
		EmbeddedDataDir:      DefaultDataDir(),

		EmbeddedQuotaBytes:                DefaultEmbeddedQuotaBytes,
		EmbeddedCompactionRetainRevisions: DefaultCompactionRetainRevisions,
	}
}

// Label is the C4 backend label of c.Kind: the embedded backend is etcd.
func (c Config) Label() string {
	if c.Kind == PG {
		return PG
	}
	return Etcd
}

// Validate checks every bound and cross-field rule of C5 for the backend
// keys. Each error is "key: message", one per problem, joined.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	switch c.Kind {
	case Embedded, Etcd, PG:
	default:
		bad("lock.backend", "%q is not one of embedded, etcd, pg", c.Kind)
	}
	if c.Kind == Etcd && len(c.EtcdEndpoints) == 0 {
		bad("lock.etcd.endpoints", "must name at least one endpoint when lock.backend=etcd")
	}
	if c.EtcdPrefix == "" || !strings.HasSuffix(c.EtcdPrefix, "/") {
		bad("lock.etcd.prefix", "%q must be non-empty and end with /", c.EtcdPrefix)
	}
	if c.EtcdDialTimeout < 100*time.Millisecond || c.EtcdDialTimeout > time.Minute {
		bad("lock.etcd.dial-timeout", "%v out of bounds [100ms, 1m]", c.EtcdDialTimeout)
	}
	if a := c.EtcdAutoSyncInterval; a != 0 && (a < MinEtcdAutoSyncInterval || a > MaxEtcdAutoSyncInterval) {
		bad("lock.etcd.auto-sync-interval", "%v must be 0 (off) or within [%v, %v]", a, MinEtcdAutoSyncInterval, MaxEtcdAutoSyncInterval)
	}
	if c.Kind == PG && c.PGDSN == "" && c.PGDSNFile == "" {
		bad("lock.pg.dsn", "must be set (or lock.pg.dsn-file) when lock.backend=pg")
	}
	c.validateSecurity(bad)
	c.validatePGSecrets(bad)
	if pgstore.ValidateSchema(c.PGSchema) != nil {
		bad("lock.pg.schema", "%q must be a lower-case SQL identifier ([a-z_][a-z0-9_]*, at most 63 bytes)", c.PGSchema)
	}
	if c.PGReaperInterval < 100*time.Millisecond || c.PGReaperInterval > time.Minute {
		bad("lock.pg.reaper-interval", "%v out of bounds [100ms, 1m]", c.PGReaperInterval)
	}
	if c.PGMaxConns < 0 || c.PGMaxConns > MaxPGMaxConns {
		bad("lock.pg.max-conns", "%d must be 0 (the DSN's pool_max_conns) or within [1, %d]", c.PGMaxConns, MaxPGMaxConns)
	}
	if c.Kind == Embedded && c.EmbeddedDataDir == "" {
		bad("lock.embedded.data-dir", "must not be empty when lock.backend=embedded")
	}
	if c.EmbeddedQuotaBytes < MinEmbeddedQuotaBytes || c.EmbeddedQuotaBytes > MaxEmbeddedQuotaBytes {
		bad("lock.embedded.quota-bytes", "%d out of bounds [%d, %d] (16 MiB..8 GiB)", c.EmbeddedQuotaBytes, MinEmbeddedQuotaBytes, MaxEmbeddedQuotaBytes)
	}
	if r := c.EmbeddedCompactionRetainRevisions; r != 0 && (r < MinCompactionRetainRevisions || r > MaxCompactionRetainRevisions) {
		bad("lock.embedded.compaction-retain-revisions", "%d must be 0 (off) or within [%d, %d]", r, MinCompactionRetainRevisions, MaxCompactionRetainRevisions)
	}
	return errors.Join(errs...)
}
