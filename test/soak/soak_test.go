package soak

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/etcdstore"
	"lock.dev/lockd/store/pgstore"
)

func TestMain(m *testing.M) { testkit.Main(pgtest.M{M: m}, nil) }

// quota is the embedded etcd's backend quota in every soak run.
const quota = 64 << 20

// plan is one soak run's shape.
type plan struct {
	duration time.Duration // per backend
	sample   time.Duration
	workers  int
	long     bool // LOCKD_SOAK_DURATION set: C5 defaults for compaction and markers
}

func planFromEnv(t *testing.T) plan {
	p := plan{duration: 8 * time.Second, sample: 400 * time.Millisecond, workers: 32}
	if v := os.Getenv("LOCKD_SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 30*time.Second {
			t.Fatalf("LOCKD_SOAK_DURATION=%q: want a Go duration of at least 30s", v)
		}
		p = plan{duration: d, sample: max(d/60, time.Second), workers: 64, long: true}
	}
	return p
}

// target is a backend under soak and how to measure it.
type target struct {
	name     string
	lifetime time.Duration // of a release marker, at most (0: none)
	st       store.LockStore
	keys     func(context.Context) (int64, error) // keys (etcd) or rows (PostgreSQL) lockd stores
	inUse    func(context.Context) (int64, error) // bytes of the database in use
	dbBytes  func(context.Context) (int64, error) // bytes of the database file(s), for the report
}

// etcdTarget starts an embedded etcd with a 64 MiB quota and an etcdstore
// on it. markerTTL < 0 is the control (markers without a lease).
func etcdTarget(t *testing.T, p plan, markerTTL time.Duration) target {
	t.Helper()
	ctx := testkit.Context(t, time.Minute)
	cfg := embedetcd.Config{DataDir: t.TempDir(), QuotaBytes: quota, CompactionRetainRevisions: backend.DefaultCompactionRetainRevisions}
	if !p.long {
		// Smoke: everything the long run does, in seconds.
		cfg.CompactionRetainRevisions, cfg.CompactionInterval = 1000, 500*time.Millisecond
	}
	srv, err := embedetcd.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start embedded etcd: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	cli, err := clientv3.New(etcdstore.ClientConfig(srv.Endpoints(), 5*time.Second))
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	st, err := etcdstore.New(ctx, cli, etcdstore.Options{MarkerTTL: markerTTL})
	if err != nil {
		t.Fatalf("etcdstore.New: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	ep := srv.Endpoints()[0]
	return target{
		name:     "etcd",
		lifetime: markerLifetime(markerTTL),
		st:       st,
		keys: func(ctx context.Context) (int64, error) {
			resp, err := cli.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly())
			if err != nil {
				return 0, err
			}
			return resp.Count, nil
		},
		inUse: func(ctx context.Context) (int64, error) {
			st, err := cli.Status(ctx, ep)
			if err != nil {
				return 0, err
			}
			return st.DbSizeInUse, nil
		},
		dbBytes: func(ctx context.Context) (int64, error) {
			st, err := cli.Status(ctx, ep)
			if err != nil {
				return 0, err
			}
			return st.DbSize, nil
		},
	}
}

// markerLifetime bounds how long a marker lives with Options.MarkerTTL
// markerTTL: a lease takes markers for half the requested TTL, etcd's
// smallest lease TTL is 2 s with the default election timeout, and expiry
// is checked every 500 ms (rounded up to 1 s).
func markerLifetime(markerTTL time.Duration) time.Duration {
	ttl := etcdstore.DefaultMarkerTTL
	if markerTTL > 0 {
		ttl = max(markerTTL, time.Second)
	}
	return ttl/2 + max(ttl, 2*time.Second) + time.Second
}

// pgTarget opens a pgstore on a fresh database.
func pgTarget(t *testing.T) target {
	t.Helper()
	ctx := testkit.Context(t, time.Minute)
	dsn := pgtest.NewDatabase(t)
	st, err := pgstore.New(ctx, pgstore.Options{DSN: dsn})
	if err != nil {
		t.Fatalf("pgstore.New: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	t.Cleanup(pool.Close)
	one := func(q string) func(context.Context) (int64, error) {
		return func(ctx context.Context) (n int64, err error) {
			err = pool.QueryRow(ctx, q).Scan(&n)
			return n, err
		}
	}
	schema := pgstore.DefaultSchema
	return target{
		name: "pg",
		st:   st,
		keys: one(fmt.Sprintf(`SELECT (SELECT count(*) FROM %[1]s.sessions) + (SELECT count(*) FROM %[1]s.locks) + (SELECT count(*) FROM %[1]s.waiters)`, schema)),
		inUse: one(fmt.Sprintf(`SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
			JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '%s' AND c.relkind = 'r'`, schema)),
		dbBytes: one(`SELECT pg_database_size(current_database())`),
	}
}

// result is what one soak run measured.
type result struct {
	ops, errs, spaceErrs int64
	firstErr             error
	keys, inUse, dbBytes []float64
	rss, goroutines      []float64
	pairs                []float64 // completed grant+release pairs so far, per sample
}

// run drives full load on distinct keys against tg for p.duration and
// samples it.
func run(t *testing.T, tg target, p plan) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), p.duration)
	defer cancel()
	var (
		res     result
		errOnce sync.Once
		wg      sync.WaitGroup
		ops     atomic.Int64
		errs    atomic.Int64
		space   atomic.Int64
	)
	fail := func(err error) {
		if ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
			return // the run's own end
		}
		errs.Add(1)
		if errors.Is(err, rpctypes.ErrNoSpace) || strings.Contains(err.Error(), "NOSPACE") {
			space.Add(1)
		}
		errOnce.Do(func() { res.firstErr = err })
	}
	for w := range p.workers {
		wg.Add(1)
		go func() { // exits when the run's ctx ends
			defer wg.Done()
			var id store.SessionID
			var beat time.Time
			for i := 0; ctx.Err() == nil; i++ {
				if id == "" || time.Since(beat) > 3*time.Second {
					if id != "" {
						if _, err := tg.st.Heartbeat(ctx, id); err != nil {
							fail(err)
							id = ""
						}
					}
					if id == "" {
						sess, err := tg.st.OpenSession(ctx, 15*time.Second)
						if err != nil {
							fail(err)
							continue
						}
						id = sess.ID
					}
					beat = time.Now()
				}
				key := "soak/" + strconv.Itoa(w) + "/" + strconv.Itoa(i)
				g, ok, err := tg.st.TryInsert(ctx, id, key)
				if err != nil || !ok {
					fail(fmt.Errorf("TryInsert(%q) = %v, %w", key, ok, err))
					continue
				}
				if err := tg.st.DeleteIfOwner(ctx, id, key, g.Token); err != nil {
					fail(fmt.Errorf("DeleteIfOwner(%q): %w", key, err))
					continue
				}
				ops.Add(1)
			}
		}()
	}
	tick := time.NewTicker(p.sample)
	defer tick.Stop()
	mctx := testkit.Context(t, p.duration+time.Minute)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
		}
		k, err1 := tg.keys(mctx)
		u, err2 := tg.inUse(mctx)
		d, err3 := tg.dbBytes(mctx)
		if err := errors.Join(err1, err2, err3); err != nil {
			t.Fatalf("sample: %v", err)
		}
		res.keys = append(res.keys, float64(k))
		res.inUse = append(res.inUse, float64(u))
		res.dbBytes = append(res.dbBytes, float64(d))
		res.rss = append(res.rss, float64(rss(t)))
		res.goroutines = append(res.goroutines, float64(runtime.NumGoroutine()))
		res.pairs = append(res.pairs, float64(ops.Load()))
	}
	wg.Wait()
	res.ops, res.errs, res.spaceErrs = ops.Load(), errs.Load(), space.Load()
	return res
}

// rss is this process's resident set size in bytes.
func rss(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatalf("read /proc/self/status: %v", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// series are the flatness checks of a result.
func (r result) series() []Series {
	return []Series{
		{Name: "db size in use", Samples: r.inUse, Tolerance: 0.25, Slack: 4 << 20},
		{Name: "RSS", Samples: r.rss, Tolerance: 0.25, Slack: 32 << 20},
		{Name: "goroutines", Samples: r.goroutines, Tolerance: 0.25, Slack: 20},
	}
}

// residue checks the stored key count against what the design allows: the
// keys of the grants in flight (at most one per worker) and of sessions
// (PostgreSQL rows), plus one marker per pair released within the marker
// lifetime before the sample (×1.2 for sampling jitter). Markers alive
// follow the release rate, which moves with the machine's load, so a fixed
// flatness bound would misjudge them; a key left behind per pair (the
// control) exceeds this bound once the run is longer than the lifetime.
// Samples of the first third, or within the lifetime of the start, are
// warm-up.
func (r result) residue(p plan, lifetime time.Duration) error {
	window := int((lifetime + p.sample - 1) / p.sample)
	for i := max(len(r.keys)/3, window); i < len(r.keys); i++ {
		allowed := 1.2*(r.pairs[i]-r.pairs[i-window]) + float64(2*p.workers) + 50
		if r.keys[i] > allowed {
			return fmt.Errorf("stored keys %.0f at sample %d exceed the %.0f allowed (%.0f pairs in the %v marker lifetime before it, %d workers): keys are left behind",
				r.keys[i], i, allowed, r.pairs[i]-r.pairs[i-window], lifetime, p.workers)
		}
	}
	return nil
}

// summary is one line of the soak report.
func (r result) summary(name string, p plan) string {
	n := len(r.keys)
	third := func(s []float64, unit float64) string {
		mx := func(s []float64) float64 {
			m := s[0]
			for _, v := range s {
				m = max(m, v)
			}
			return m / unit
		}
		return fmt.Sprintf("%.1f/%.1f/%.1f", mx(s[:n/3]), mx(s[n/3:2*n/3]), mx(s[2*n/3:]))
	}
	return fmt.Sprintf("%s: %v, %d workers, %d grant+release pairs (%.0f/s), %d errors (%d for space); max per third (warm-up/middle/last): keys %s k, db in use %s MiB, db file %s MiB, RSS %s MiB, goroutines %s",
		name, p.duration, p.workers, r.ops, float64(r.ops)/p.duration.Seconds(), r.errs, r.spaceErrs,
		third(r.keys, 1000), third(r.inUse, 1<<20), third(r.dbBytes, 1<<20), third(r.rss, 1<<20), third(r.goroutines, 1))
}

func report(t *testing.T, line string) {
	t.Log(line)
	if f := os.Getenv("LOCKD_SOAK_REPORT"); f != "" {
		fh, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatalf("LOCKD_SOAK_REPORT: %v", err)
		}
		defer fh.Close()
		fmt.Fprintln(fh, line)
	}
}

func backends() []string {
	if v := os.Getenv("LOCKD_SOAK_BACKENDS"); v != "" {
		return strings.Split(v, ",")
	}
	return []string{"etcd", "pg"}
}

func TestSoak(t *testing.T) {
	p := planFromEnv(t)
	for _, b := range backends() {
		t.Run(b, func(t *testing.T) {
			var tg target
			switch b {
			case "etcd":
				markerTTL := time.Duration(0) // the default
				if !p.long {
					markerTTL = time.Second
				}
				tg = etcdTarget(t, p, markerTTL)
			case "pg":
				tg = pgTarget(t)
			default:
				t.Fatalf("LOCKD_SOAK_BACKENDS: unknown backend %q", b)
			}
			r := run(t, tg, p)
			report(t, r.summary(b, p))
			if r.ops == 0 {
				t.Fatalf("no grant+release pair completed; first error: %v", r.firstErr)
			}
			if r.spaceErrs > 0 {
				t.Errorf("%d requests failed for space; first error: %v", r.spaceErrs, r.firstErr)
			}
			if r.errs*100 > r.ops {
				t.Errorf("%d of %d requests failed; first error: %v", r.errs, r.ops, r.firstErr)
			}
			if err := r.residue(p, tg.lifetime); err != nil {
				t.Errorf("%s: %v", b, err)
			}
			for _, s := range r.series() {
				if err := Flat(s); err != nil {
					t.Errorf("%s: %v", b, err)
				}
			}
		})
	}
}

// TestSoakControl: the etcd smoke with release markers attached to no
// lease, as before issue 11. Every released key leaves its marker, so the
// stored key count grows and Flat must catch it.
func TestSoakControl(t *testing.T) {
	p := planFromEnv(t)
	if p.long {
		p = plan{duration: 8 * time.Second, sample: 400 * time.Millisecond, workers: 32}
	}
	tg := etcdTarget(t, p, -1)
	tg.lifetime = markerLifetime(time.Second) // what the smoke allows
	r := run(t, tg, p)
	report(t, "control (markers without a lease) "+r.summary("etcd", p))
	if r.ops == 0 {
		t.Fatalf("no grant+release pair completed; first error: %v", r.firstErr)
	}
	if err := r.residue(p, tg.lifetime); err == nil {
		t.Fatalf("markers without a lease: the key count passed (%v); the checker is blind", r.keys)
	} else {
		t.Logf("control caught: %v", err)
	}
}
