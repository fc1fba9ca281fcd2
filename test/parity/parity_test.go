package parity

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(childClientEnv); spec != "" {
		os.Exit(runChildClient(spec)) // the client process of client-sigkill
	}
	testkit.Main(pgtest.M{M: m}, []func(){removeBuildDir})
}

// removeBuildDir removes the binaries built for the child processes.
func removeBuildDir() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	if tsDir != "" {
		_ = os.RemoveAll(tsDir)
	}
}

// Backend names as the table prints them. The TLS rows run the same
// backend as their base row over an authenticated, encrypted connection:
// etcd-tls is lockd on an external etcd that serves clients over TLS and
// requires a client certificate (lock.etcd.tls.*); pg-tls is lockd on a
// PostgreSQL with ssl=on, reached with sslmode=verify-full (DSN from
// lock.pg.dsn-file).
const (
	backendEmbedded = "embedded"
	backendEtcd     = "etcd"
	backendPG       = "pg"
	backendEtcdTLS  = "etcd-tls"
	backendPGTLS    = "pg-tls"
)

var backendNames = []string{backendEmbedded, backendEtcd, backendPG, backendEtcdTLS, backendPGTLS}

// rowsEnv names TestParity's rows. `make test` (go test ./...) leaves it
// unset and runs the base rows (embedded, etcd, pg); `make parity` sets it
// to "all" and adds the TLS rows, which change lockd's transport to its
// backend only (baseBackend) and cost about 47 s of a loaded run: the
// transport itself is tested in make test by internal/backend's
// security tests (issue 21, CI time). A comma-separated list picks rows.
const rowsEnv = "LOCKD_PARITY_ROWS"

// parityRows returns TestParity's rows in this test run.
func parityRows(t *testing.T) []string {
	switch v := os.Getenv(rowsEnv); v {
	case "":
		return []string{backendEmbedded, backendEtcd, backendPG}
	case "all":
		return backendNames
	default:
		var rows []string
		for _, r := range strings.Split(v, ",") {
			if !slices.Contains(backendNames, r) {
				t.Fatalf("%s=%q: %q is not one of %v (or \"all\")", rowsEnv, v, r, backendNames)
			}
			rows = append(rows, r)
		}
		return rows
	}
}

// baseBackend is the backend whose expectations (and documented
// divergences) a row shares: the TLS rows change the transport only.
func baseBackend(name string) string {
	switch name {
	case backendEtcdTLS:
		return backendEtcd
	case backendPGTLS:
		return backendPG
	}
	return name
}

// env is one backend under test.
type env struct {
	name string
	bins binaries
	// lineage returns the `lockd serve` flags of a fresh, isolated backend
	// state: every lockd started with the same flags shares it (a restart).
	lineage func(t *testing.T) []string
	// shared serves the scenarios that do not stop lockd.
	shared *lockd
}

// etcdPrefixes numbers the key prefixes of lockds on the external etcd.
var etcdPrefixes atomic.Int64

// newEnv prepares backend name: for etcd it starts the external etcd
// process, which lives until t ends.
func newEnv(t *testing.T, bins binaries, name string) *env {
	t.Helper()
	e := &env{name: name, bins: bins}
	switch name {
	case backendEmbedded:
		e.lineage = func(t *testing.T) []string {
			return []string{"--backend", "embedded", "--data-dir", t.TempDir()}
		}
	case backendEtcd:
		endpoints := startEtcd(t, bins)
		e.lineage = func(*testing.T) []string {
			return []string{"--backend", "etcd", "--etcd-endpoints", endpoints,
				"--etcd-prefix", fmt.Sprintf("/parity/%d/", etcdPrefixes.Add(1))}
		}
	case backendPG:
		e.lineage = func(t *testing.T) []string {
			return []string{"--backend", "pg", "--pg-dsn", pgtest.NewDatabase(t)}
		}
	case backendEtcdTLS:
		f := newTLSFiles(t)
		endpoints := startEtcd(t, bins, "--cert-file", f.serverCert, "--key-file", f.serverKey, "--client-ca-file", f.ca)
		if !strings.HasPrefix(endpoints, "https://") {
			t.Fatalf("etcd with TLS serves %q; want https:// endpoints", endpoints)
		}
		e.lineage = func(*testing.T) []string {
			return []string{"--backend", "etcd", "--etcd-endpoints", endpoints,
				"--etcd-prefix", fmt.Sprintf("/parity/%d/", etcdPrefixes.Add(1)),
				"--etcd-tls-ca-file", f.ca, "--etcd-tls-cert-file", f.clientCert, "--etcd-tls-key-file", f.clientKey}
		}
	case backendPGTLS:
		f := newTLSFiles(t)
		srv := startSSLPostgres(t, f)
		e.lineage = func(t *testing.T) []string {
			return []string{"--backend", "pg", "--pg-dsn-file", sslDatabase(t, srv, f)}
		}
	default:
		t.Fatalf("unknown backend %q", name)
	}
	e.shared = startLockd(t, bins, e.lineage(t))
	return e
}

// fresh starts a lockd of the scenario's own on a fresh backend state.
func (e *env) fresh(t *testing.T) *lockd {
	t.Helper()
	return startLockd(t, e.bins, e.lineage(t))
}

// result is one row of the table.
type result struct {
	scenario, backend, outcome, want string
	failed                           bool // the subtest failed (an assertion, or the outcome)
}

// TestParity runs every scenario on every backend (backends in parallel,
// scenarios of one backend in order) and prints the table once all are done.
func TestParity(t *testing.T) {
	for _, sc := range scenarios {
		for b := range sc.override {
			if sc.divergence == "" || !slices.Contains(backendNames, b) || baseBackend(b) != b {
				t.Fatalf("scenario %s overrides %q without naming a documented divergence", sc.name, b)
			}
		}
	}
	rows := parityRows(t)
	bins := build(t)
	var (
		mu      sync.Mutex
		results []result
	)
	t.Cleanup(func() { // after the parallel backend subtests
		mu.Lock()
		defer mu.Unlock()
		printTable(results)
		checkCoverage(t, results, rows)
	})
	for _, name := range rows {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, bins, name)
			for _, sc := range scenarios {
				want := sc.expect(name)
				var outcome string
				ran := t.Run(sc.name, func(t *testing.T) {
					outcome = sc.run(t, e)
					if outcome != want {
						t.Errorf("outcome on %s:\n got: %s\nwant: %s", name, outcome, want)
					}
				})
				if outcome == "" {
					outcome = "(scenario failed before an outcome)"
				}
				mu.Lock()
				results = append(results, result{sc.name, name, outcome, want, !ran})
				mu.Unlock()
			}
		})
	}
}

// checkCoverage fails the test if a scenario did not report on every
// backend (for example because a backend's setup failed).
func checkCoverage(t *testing.T, results []result, rows []string) {
	t.Helper()
	if want := len(scenarios) * len(rows); len(results) != want {
		t.Errorf("%d results; want %d (every scenario on every row of %v)", len(results), want, rows)
	}
}

// maxOutcomeWidth caps the padding of the outcome column.
const maxOutcomeWidth = 110

// printTable prints one row per scenario and backend, scenarios in suite
// order and backends in backendNames order.
func printTable(results []result) {
	order := map[string]int{}
	for i, sc := range scenarios {
		order[sc.name] = i
	}
	slices.SortStableFunc(results, func(a, b result) int {
		if d := order[a.scenario] - order[b.scenario]; d != 0 {
			return d
		}
		return slices.Index(backendNames, a.backend) - slices.Index(backendNames, b.backend)
	})
	wScen, wBack, wOut := len("scenario"), len("backend"), len("outcome")
	for _, r := range results {
		wScen, wBack, wOut = max(wScen, len(r.scenario)), max(wBack, len(r.backend)), max(wOut, len(r.outcome))
	}
	wOut = min(wOut, maxOutcomeWidth) // longer outcomes push their ok column out
	var b strings.Builder
	backends := map[string]bool{}
	for _, r := range results {
		backends[r.backend] = true
	}
	fmt.Fprintf(&b, "\nparity: %d scenarios x %d backends\n", len(scenarios), len(backends))
	fmt.Fprintf(&b, "%-*s | %-*s | %-*s | ok\n", wScen, "scenario", wBack, "backend", wOut, "outcome")
	fmt.Fprintf(&b, "%s-|-%s-|-%s-|---\n", strings.Repeat("-", wScen), strings.Repeat("-", wBack), strings.Repeat("-", wOut))
	for _, r := range results {
		ok := "ok"
		switch {
		case r.outcome != r.want:
			ok = "FAIL (want: " + r.want + ")"
		case r.failed:
			ok = "FAIL (an assertion; see the log)"
		}
		fmt.Fprintf(&b, "%-*s | %-*s | %-*s | %s\n", wScen, r.scenario, wBack, r.backend, wOut, r.outcome, ok)
	}
	b.WriteString("intended divergences relied upon:\n")
	for _, sc := range scenarios {
		for _, name := range backendNames {
			if _, ok := sc.override[baseBackend(name)]; ok {
				fmt.Fprintf(&b, "  %s on %s: %s\n", sc.name, name, sc.divergence)
			}
		}
	}
	fmt.Print(b.String())
}
