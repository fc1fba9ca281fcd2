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
	testkit.DefaultParallel(rowsAtOnce)
	testkit.Main(pgtest.M{M: m}, []func(){removeBuildDir})
}

// rowsAtOnce is the package's -parallel: how many rows (a backend row of
// TestParity, TestParityReplicas, TestParityPython or TestParityTypeScript,
// or TestEtcdClusterRetriesTakenPort) run at once. Every test but
// TestAgentSessionOutlivesStall (which runs first, alone) is parallel, so
// the rows of all of them share these slots (before, the tests ran one
// after another and each left a slot idle once its shortest row ended:
// 209 s for about 300 s of rows, two at a time). A row
// mostly waits — for lockd, etcd and agent processes to start, for TTLs to
// run out, for polls — and each has processes, a backend state and keys of
// its own, so more rows at once cost little CPU (docs/reliability.md "CI
// time": the package's CPU seconds against its wall time, and pass counts
// beside a CPU burner). The sessions whose expiry is not a scenario's
// subject keep the margins they had beside one other row and beside
// another package in make test: the agents' agentTTL (15 s), the rolling
// restart's rollingRestartTTL; the bounds of the scenarios that wait for an
// expiry are ttl + slack (9 s for a 3 s TTL). `go test -parallel N` still
// wins.
const rowsAtOnce = 4

// removeBuildDir removes the binaries built for the child processes (once
// the TypeScript SDK's build, if one started, has ended).
func removeBuildDir() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	if tsDone != nil {
		<-tsDone
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
	return rowsFromEnv(t, rowsEnv, backendNames, []string{backendEmbedded, backendEtcd, backendPG})
}

// rowsFromEnv reads the rows named by the environment variable env: unset,
// the default rows def; "all", every row of all; else a comma-separated
// list of rows of all.
func rowsFromEnv(t *testing.T, env string, all, def []string) []string {
	switch v := os.Getenv(env); v {
	case "":
		return def
	case "all":
		return all
	default:
		var rows []string
		for _, r := range strings.Split(v, ",") {
			if !slices.Contains(all, r) {
				t.Fatalf("%s=%q: %q is not one of %v (or \"all\")", env, v, r, all)
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
	// notRun: -run did not select the subtest (t.Run returns true without
	// calling it); the row is neither passed nor failed.
	notRun bool
}

// notSelected is the outcome of a row -run did not select.
const notSelected = "(not selected by -run)"

// runRow runs one scenario's subtest and returns its row. f returns the
// outcome; a subtest -run did not select is a notRun row.
func runRow(t *testing.T, scenario, backend, want string, f func(t *testing.T) string) result {
	t.Helper()
	var outcome string
	started := false
	ran := t.Run(scenario, func(t *testing.T) {
		started = true
		outcome = f(t)
		if outcome != want {
			t.Errorf("outcome on %s:\n got: %s\nwant: %s", backend, outcome, want)
		}
	})
	switch {
	case !started:
		return result{scenario: scenario, backend: backend, outcome: notSelected, want: want, notRun: true}
	case outcome == "":
		outcome = "(scenario failed before an outcome)"
	}
	return result{scenario: scenario, backend: backend, outcome: outcome, want: want, failed: !ran}
}

// unselectedRows are the rows of every backend whose subtest -run did not
// select (it never started), so that a run of a few subtests still
// accounts for every row.
func unselectedRows(started map[string]bool, backends, scenarios []string) []result {
	var out []result
	for _, b := range backends {
		if started[b] {
			continue
		}
		for _, sc := range scenarios {
			out = append(out, result{scenario: sc, backend: b, outcome: notSelected, notRun: true})
		}
	}
	return out
}

// rowVerdict is a row's ok column.
func rowVerdict(r result) string {
	switch {
	case r.notRun:
		return "-"
	case r.outcome != r.want:
		return "FAIL (want: " + r.want + ")"
	case r.failed:
		return "FAIL (an assertion; see the log)"
	}
	return "ok"
}

// TestParity runs every scenario on every backend (backends in parallel,
// beside the other tests' rows; scenarios of one backend in order) and
// prints the table once all are done.
func TestParity(t *testing.T) {
	t.Parallel() // beside the other row tests (TestMain)
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
		started = map[string]bool{}
	)
	t.Cleanup(func() { // after the parallel backend subtests
		mu.Lock()
		defer mu.Unlock()
		names := make([]string, len(scenarios))
		for i, sc := range scenarios {
			names[i] = sc.name
		}
		results = append(results, unselectedRows(started, rows, names)...)
		printTable(results)
		checkCoverage(t, results, rows)
	})
	for _, name := range rows {
		t.Run(name, func(t *testing.T) {
			mu.Lock()
			started[name] = true
			mu.Unlock()
			t.Parallel()
			e := newEnv(t, bins, name)
			for _, sc := range scenarios {
				r := runRow(t, sc.name, name, sc.expect(name), func(t *testing.T) string { return sc.run(t, e) })
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		})
	}
}

// checkCoverage fails the test if a scenario did not report on every
// backend (for example because a backend's setup failed); a row -run did
// not select reports as notRun.
func checkCoverage(t *testing.T, results []result, rows []string) {
	t.Helper()
	if want := len(scenarios) * len(rows); len(results) != want {
		t.Errorf("%d results; want %d (every scenario on every row of %v)", len(results), want, rows)
	}
}

// selectedNote says how many rows -run left out, if any.
func selectedNote(results []result) string {
	n := 0
	for _, r := range results {
		if r.notRun {
			n++
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d of %d rows run; the others not selected by -run)", len(results)-n, len(results))
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
	fmt.Fprintf(&b, "\nparity: %d scenarios x %d backends%s\n", len(scenarios), len(backends), selectedNote(results))
	fmt.Fprintf(&b, "%-*s | %-*s | %-*s | ok\n", wScen, "scenario", wBack, "backend", wOut, "outcome")
	fmt.Fprintf(&b, "%s-|-%s-|-%s-|---\n", strings.Repeat("-", wScen), strings.Repeat("-", wBack), strings.Repeat("-", wOut))
	for _, r := range results {
		fmt.Fprintf(&b, "%-*s | %-*s | %-*s | %s\n", wScen, r.scenario, wBack, r.backend, wOut, r.outcome, rowVerdict(r))
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
