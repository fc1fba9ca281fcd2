package backend_test

import (
	"context"
	"net"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/pgstore"
)

func TestMain(m *testing.M) { testkit.Main(pgtest.M{M: m}, []func(){etcdtest.Stop}) }

// TestOpenClose opens each kind of backend on real components, uses the
// store, and closes it: Close is idempotent, the store refuses work
// afterwards, and an embedded etcd is stopped.
func TestOpenClose(t *testing.T) {
	tests := []struct {
		kind string
		cfg  func(t *testing.T) backend.Config
	}{
		{backend.Embedded, func(t *testing.T) backend.Config {
			cfg := backend.DefaultConfig()
			cfg.EmbeddedDataDir = t.TempDir()
			return cfg
		}},
		{backend.Etcd, func(t *testing.T) backend.Config {
			cfg := backend.DefaultConfig()
			cfg.Kind, cfg.EtcdEndpoints, cfg.EtcdPrefix = backend.Etcd, etcdtest.Endpoints(t), etcdtest.Prefix(t)
			return cfg
		}},
		{backend.PG, func(t *testing.T) backend.Config {
			cfg := backend.DefaultConfig()
			cfg.Kind, cfg.PGDSN, cfg.PGSchema = backend.PG, pgtest.NewDatabase(t), "lockd_backend_test"
			return cfg
		}},
	}
	for _, tt := range tests {
		t.Run(tt.kind, func(t *testing.T) {
			cfg := tt.cfg(t)
			ctx := testkit.Context(t, time.Minute)
			m, err := telemetry.NewMetrics(prometheus.NewRegistry(), cfg.Label())
			if err != nil {
				t.Fatal(err)
			}
			b, err := backend.Open(ctx, cfg, nil, m)
			if err != nil {
				t.Fatalf("Open(%+v): %v", cfg, err)
			}
			if got, want := b.Label(), cfg.Label(); got != want {
				t.Errorf("Label() = %q, want %q", got, want)
			}
			eps := b.Endpoints()
			switch tt.kind {
			case backend.PG:
				if eps != nil {
					t.Errorf("Endpoints() = %v, want nil for pg", eps)
				}
			case backend.Etcd:
				if !reflect.DeepEqual(eps, cfg.EtcdEndpoints) {
					t.Errorf("Endpoints() = %v, want lock.etcd.endpoints %v", eps, cfg.EtcdEndpoints)
				}
			case backend.Embedded:
				if len(eps) == 0 {
					t.Errorf("Endpoints() is empty for the embedded etcd")
				}
			}

			s, err := b.OpenSession(ctx, 5*time.Second)
			if err != nil {
				t.Fatalf("OpenSession: %v", err)
			}
			g, ok, err := b.TryInsert(ctx, s.ID, "k")
			if err != nil || !ok || g.Token == 0 {
				t.Fatalf("TryInsert(k) = %+v, %v, %v; want a grant with a token", g, ok, err)
			}
			if n, err := b.CloseSession(ctx, s.ID); err != nil || n != 1 {
				t.Fatalf("CloseSession = %d, %v; want 1, nil", n, err)
			}

			if err := b.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := b.Close(); err != nil {
				t.Errorf("second Close: %v, want the first call's nil", err)
			}
			if _, err := b.OpenSession(ctx, 5*time.Second); err == nil {
				t.Errorf("OpenSession after Close succeeded, want an error")
			}
			if tt.kind == backend.Embedded {
				u, err := url.Parse(eps[0])
				if err != nil {
					t.Fatal(err)
				}
				// The embedded etcd serves its clients on a unix socket.
				if c, err := net.DialTimeout("unix", u.Path, time.Second); err == nil {
					c.Close()
					t.Errorf("embedded etcd still accepts connections on %s after Close", u.Path)
				}
			}
		})
	}
}

// TestPGPoolSize: lock.pg.max-conns reaches the store's pool: the default
// 16 (not pgxpool's max(4, CPUs)), a value of its own, and 0 leaves the
// DSN's pool_max_conns, which a non-zero key overrides.
func TestPGPoolSize(t *testing.T) {
	for _, tt := range []struct {
		name    string
		key     int
		dsnPool string // pool_max_conns in the DSN; "" for none
		want    int
	}{
		{"default", backend.DefaultPGMaxConns, "", 16},
		{"key", 7, "", 7},
		{"dsn when the key is 0", 0, "3", 3},
		{"key over the dsn", 9, "3", 9},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := backend.DefaultConfig()
			cfg.Kind, cfg.PGDSN, cfg.PGMaxConns = backend.PG, pgtest.NewDatabase(t), tt.key
			if tt.dsnPool != "" {
				u, err := url.Parse(cfg.PGDSN)
				if err != nil {
					t.Fatalf("parse the test DSN: %v", err)
				}
				q := u.Query()
				q.Set("pool_max_conns", tt.dsnPool)
				u.RawQuery = q.Encode()
				cfg.PGDSN = u.String()
			}
			b, err := backend.Open(testkit.Context(t, time.Minute), cfg, nil, nil)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer b.Close()
			ps, ok := b.LockStore.(*pgstore.Store)
			if !ok {
				t.Fatalf("store is %T, want *pgstore.Store", b.LockStore)
			}
			if got := ps.PoolMaxConns(); got != tt.want {
				t.Errorf("pool MaxConns = %d, want %d (lock.pg.max-conns %d, DSN pool_max_conns %q)", got, tt.want, tt.key, tt.dsnPool)
			}
		})
	}
}

// TestOpenUnreachable: a backend that cannot be reached is an error naming
// the key to fix, and whatever Open started is closed again (TestMain checks
// for leaked goroutines).
func TestOpenUnreachable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()

	etcd := backend.DefaultConfig()
	etcd.Kind, etcd.EtcdEndpoints, etcd.EtcdDialTimeout = backend.Etcd, []string{"http://" + dead}, 300*time.Millisecond
	pg := backend.DefaultConfig()
	pg.Kind, pg.PGDSN = backend.PG, "postgres://lockd@"+dead+"/x?connect_timeout=1"
	for _, tt := range []struct {
		name string
		cfg  backend.Config
		want string
	}{
		{"etcd", etcd, "(lock.etcd.endpoints)"},
		{"pg", pg, "(lock.pg.dsn)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := backend.Open(testkit.Context(t, time.Minute), tt.cfg, nil, nil)
			if err == nil {
				b.Close()
				t.Fatalf("Open(%s at %s) succeeded, want an error", tt.name, dead)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Open(%s at %s) = %v, want an error naming %s", tt.name, dead, err, tt.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	with := func(f func(*backend.Config)) backend.Config {
		c := backend.DefaultConfig()
		f(&c)
		return c
	}
	tests := []struct {
		name string
		cfg  backend.Config
		want []string // substrings of the error; none: valid
	}{
		{"defaults", backend.DefaultConfig(), nil},
		{"etcd", with(func(c *backend.Config) { c.Kind, c.EtcdEndpoints = backend.Etcd, []string{"a:1"} }), nil},
		{"pg", with(func(c *backend.Config) { c.Kind, c.PGDSN = backend.PG, "postgres://h/db" }), nil},
		{"bad schema", with(func(c *backend.Config) { c.PGSchema = "Bad-Name" }),
			[]string{`lock.pg.schema: "Bad-Name" must be a lower-case SQL identifier`}},
		{"schema starting with a digit", with(func(c *backend.Config) { c.PGSchema = "1x" }), []string{"lock.pg.schema"}},
		{"schema too long", with(func(c *backend.Config) { c.PGSchema = strings.Repeat("a", 64) }), []string{"lock.pg.schema"}},
		{"empty schema", with(func(c *backend.Config) { c.PGSchema = "" }), []string{"lock.pg.schema"}},
		{"bad kind", with(func(c *backend.Config) { c.Kind = "zk" }), []string{`lock.backend: "zk" is not one of`}},
		{"etcd without endpoints", with(func(c *backend.Config) { c.Kind = backend.Etcd }), []string{"lock.etcd.endpoints"}},
		{"pg without dsn", with(func(c *backend.Config) { c.Kind = backend.PG }), []string{"lock.pg.dsn"}},
		{"embedded without dir", with(func(c *backend.Config) { c.EmbeddedDataDir = "" }), []string{"lock.embedded.data-dir"}},
		{"prefix without slash", with(func(c *backend.Config) { c.EtcdPrefix = "/x" }), []string{"lock.etcd.prefix"}},
		{"dial timeout", with(func(c *backend.Config) { c.EtcdDialTimeout = time.Hour }), []string{"lock.etcd.dial-timeout"}},
		{"auto-sync off", with(func(c *backend.Config) { c.EtcdAutoSyncInterval = 0 }), nil},
		{"auto-sync too often", with(func(c *backend.Config) { c.EtcdAutoSyncInterval = 500 * time.Millisecond }),
			[]string{"lock.etcd.auto-sync-interval"}},
		{"auto-sync too rare", with(func(c *backend.Config) { c.EtcdAutoSyncInterval = 2 * time.Hour }),
			[]string{"lock.etcd.auto-sync-interval"}},
		{"auto-sync negative", with(func(c *backend.Config) { c.EtcdAutoSyncInterval = -time.Second }),
			[]string{"lock.etcd.auto-sync-interval"}},
		{"reaper interval", with(func(c *backend.Config) { c.PGReaperInterval = time.Millisecond }), []string{"lock.pg.reaper-interval"}},
		{"pg pool from the dsn", with(func(c *backend.Config) { c.PGMaxConns = 0 }), nil},
		{"pg pool negative", with(func(c *backend.Config) { c.PGMaxConns = -1 }), []string{"lock.pg.max-conns"}},
		{"pg pool too large", with(func(c *backend.Config) { c.PGMaxConns = 1001 }), []string{"lock.pg.max-conns"}},
		{"quota too small", with(func(c *backend.Config) { c.EmbeddedQuotaBytes = 1 << 20 }), []string{"lock.embedded.quota-bytes"}},
		{"quota too large", with(func(c *backend.Config) { c.EmbeddedQuotaBytes = 16 << 30 }), []string{"lock.embedded.quota-bytes"}},
		{"retain too few", with(func(c *backend.Config) { c.EmbeddedCompactionRetainRevisions = 10 }),
			[]string{"lock.embedded.compaction-retain-revisions"}},
		{"retain negative", with(func(c *backend.Config) { c.EmbeddedCompactionRetainRevisions = -1 }),
			[]string{"lock.embedded.compaction-retain-revisions"}},
		{"several at once", with(func(c *backend.Config) { c.Kind, c.PGSchema = backend.PG, "X" }),
			[]string{"lock.pg.dsn", "lock.pg.schema"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Errorf("Validate(%+v) = %v, want nil", tt.cfg, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate(%+v) = nil, want an error containing %q", tt.cfg, tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate error %q does not contain %q", err, w)
				}
			}
			// Open checks the same rules before starting anything.
			if _, oerr := backend.Open(context.Background(), tt.cfg, nil, nil); oerr == nil || !strings.Contains(oerr.Error(), err.Error()) {
				t.Errorf("Open with an invalid config = %v, want the Validate error %v", oerr, err)
			}
		})
	}
}

func TestLabel(t *testing.T) {
	for kind, want := range map[string]string{backend.Embedded: "etcd", backend.Etcd: "etcd", backend.PG: "pg"} {
		if got := (backend.Config{Kind: kind}).Label(); got != want {
			t.Errorf("Config{Kind: %q}.Label() = %q, want %q", kind, got, want)
		}
	}
}

var _ store.LockStore = (*backend.Backend)(nil)
