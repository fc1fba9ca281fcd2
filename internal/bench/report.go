package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Value is a measured figure. +Inf stands for an unbounded ratio (fairness
// when some client never got the lock); it is written as null in JSON.
type Value float64

// MarshalJSON writes v as a JSON number, or null when it is not finite.
func (v Value) MarshalJSON() ([]byte, error) {
	f := float64(v)
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, f, 'g', 6, 64), nil
}

// String formats v for the table: whole numbers as such, else three
// significant figures (no decimals from 100 up), "inf" when unbounded.
func (v Value) String() string {
	f := float64(v)
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsNaN(f):
		return "-"
	case f == math.Trunc(f) && math.Abs(f) < 1e15:
		return strconv.FormatFloat(f, 'f', 0, 64)
	case math.Abs(f) >= 100:
		return strconv.FormatFloat(f, 'f', 0, 64)
	case math.Abs(f) >= 10:
		return strconv.FormatFloat(f, 'f', 1, 64)
	case math.Abs(f) >= 1:
		return strconv.FormatFloat(f, 'f', 2, 64)
	}
	return strconv.FormatFloat(f, 'g', 3, 64)
}

// Metric names of Row.Metric.
const (
	MetricPairsPerSec     = "pairs/s"
	MetricP50             = "p50 ms"
	MetricP99             = "p99 ms"
	MetricHandoversPerSec = "hand-overs/s"
	MetricFairness        = "fairness max/min"
	MetricGoneMs          = "ms until all gone"
	MetricCPU             = "cpu % of a core"
	MetricRSS             = "rss MiB"
	MetricPeakRSS         = "peak rss MiB"
	MetricAlive           = "sessions alive at end"
	MetricClientCPU       = "client cpu % of a core"
	MetricOpsPerSec       = "ops/s"
	MetricHandoverP50     = "hand-over p50 ms"
	MetricHandoverP99     = "hand-over p99 ms"
	MetricObservedP50     = "observed p50 ms"
	MetricObservedP99     = "observed p99 ms"
	MetricObservedPct     = "leaders observed %"
	// The semaphore rows.
	MetricAcquisitionsPerSec = "acquisitions/s"
	MetricWaitP50            = "wait p50 ms"
	MetricWaitP99            = "wait p99 ms"
	MetricMostHolders        = "most holders at once"
)

// Row is one line of the report: one lockd figure, and the same figure of
// one baseline with the ratio lockd / baseline when the scenario has one.
// A ceiling row (scenario "ceiling") has no lockd figure (NaN, null in
// JSON): Baseline names the ceiling and Raw is its figure.
type Row struct {
	Scenario string `json:"scenario"`
	// Concurrency is the number of clients (distinct, contended).
	Concurrency int `json:"concurrency,omitempty"`
	// N is the number of locks (death) or sessions (idle, scale).
	N int `json:"n,omitempty"`
	// Replicas is the number of lockd replicas (scale).
	Replicas int    `json:"replicas,omitempty"`
	Metric   string `json:"metric"`
	// SDK names the SDK of an SDK row (sdk.go): Lockd is lockd's figure
	// through it and Raw the Go SDK's (Baseline go-sdk); "" for the Go SDK.
	SDK   string `json:"sdk,omitempty"`
	Lockd Value  `json:"lockd"`
	// Baseline names the system compared with ("" when there is none).
	Baseline string `json:"baseline,omitempty"`
	Raw      *Value `json:"raw,omitempty"`
	// Ratio is Lockd / Raw.
	Ratio *Value `json:"ratio,omitempty"`
	// LockdCeil and RawCeil are lockd's and the baseline's commits/s as a
	// percentage of the backend's ceiling at the same concurrency
	// (distinct pairs/s rows).
	LockdCeil *Value `json:"lockd_ceiling_pct,omitempty"`
	RawCeil   *Value `json:"raw_ceiling_pct,omitempty"`
	// Flags mark what makes a figure suspect: a baseline below 50 % of
	// its ceiling, one slower than at the previous concurrency.
	Flags []string `json:"flags,omitempty"`
	// Target is issue 5's target for this row, if it has one, and Met
	// whether this run reached it.
	Target string `json:"target,omitempty"`
	Met    *bool  `json:"met,omitempty"`
	// LockdRounds and RawRounds are the per-round figures the medians come
	// from (rates, fairness, death times).
	LockdRounds []Value `json:"lockd_rounds,omitempty"`
	RawRounds   []Value `json:"raw_rounds,omitempty"`
	Note        string  `json:"note,omitempty"`
}

// Machine describes where the benchmark ran.
type Machine struct {
	Hostname   string `json:"hostname"`
	CPUModel   string `json:"cpu_model,omitempty"`
	NumCPU     int    `json:"nproc"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GoVersion  string `json:"go_version"`
	OSArch     string `json:"os_arch"`
	// LoadStart and LoadEnd are /proc/loadavg at the start and the end.
	LoadStart string `json:"load_start,omitempty"`
	LoadEnd   string `json:"load_end,omitempty"`
}

// Settings are the parameters of the run.
type Settings struct {
	Backend               string   `json:"backend"`
	BackendVersion        string   `json:"backend_version,omitempty"`
	Duration              string   `json:"duration"`
	Rounds                int      `json:"rounds"`
	Scenarios             []string `json:"scenarios"`
	DistinctConcurrency   []int    `json:"distinct_concurrency"`
	ContendedConcurrency  []int    `json:"contended_concurrency"`
	DeathLocks            []int    `json:"death_locks"`
	ElectionConcurrency   []int    `json:"election_concurrency"`
	SemaphoreConcurrency  []int    `json:"semaphore_concurrency"`
	SemaphoreLimit        int      `json:"semaphore_limit"`
	AcquireAllConcurrency []int    `json:"acquire_all_concurrency,omitempty"`
	AcquireAllKeys        int      `json:"acquire_all_keys,omitempty"`
	IdleSessions          int      `json:"idle_sessions"`
	IdleDuration          string   `json:"idle_duration"`
	FailoverKills         int      `json:"failover_kills"`
	// ScaleSessions, ScaleReplicas and ScaleDuration are the scale
	// scenario's points and window, when it ran.
	ScaleSessions   []int  `json:"scale_sessions,omitempty"`
	ScaleReplicas   []int  `json:"scale_replicas,omitempty"`
	ScaleDuration   string `json:"scale_duration,omitempty"`
	SessionTTL      string `json:"session_ttl"`
	PGPoolMaxConns  int    `json:"pg_pool_max_conns,omitempty"`
	LockdPGMaxConns int    `json:"lockd_pg_max_conns,omitempty"`
	// BackendProcess says where the backend ran, Durability how it
	// commits (etcd's fsync; PostgreSQL's fsync, synchronous_commit,
	// wal_sync_method …).
	BackendProcess string `json:"backend_process,omitempty"`
	Durability     string `json:"durability,omitempty"`
	// DataDir is where the fsync ceiling wrote: the backend's data
	// directory unless DataDirNote says otherwise; DataDirFS its
	// filesystem.
	DataDir     string `json:"data_dir,omitempty"`
	DataDirFS   string `json:"data_dir_fs,omitempty"`
	DataDirNote string `json:"data_dir_note,omitempty"`
	// SystemOrder says how the systems take turns.
	SystemOrder string `json:"system_order"`
	// Processes says which process each system runs in.
	Processes string `json:"processes"`
	// SDKs are the SDKs of the SDK rows, measured at SDKConcurrency.
	SDKs           []string `json:"sdks,omitempty"`
	SDKConcurrency []int    `json:"sdk_concurrency,omitempty"`
}

// Report is the outcome of Run.
type Report struct {
	Start    time.Time `json:"start"`
	Took     string    `json:"took"`
	Machine  Machine   `json:"machine"`
	Settings Settings  `json:"settings"`
	Rows     []Row     `json:"rows"`
	// Notes say what else happened during the run (retried errors).
	Notes []string `json:"notes,omitempty"`
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("bench: write json: %w", err)
	}
	return nil
}

// systemLegend explains the system names of the table.
var systemLegend = []string{
	"lockd           lockd gRPC server (127.0.0.1; a `lockd serve` child unless in one process) + Go SDK, one session per client",
	"lockd-all       acquire-all: lockd, Session.AcquireAll of a set of 4 keys (one commit for a set of free keys), ReleaseAll",
	"lockd-sorted    acquire-all: lockd, Session.Acquire of each key of the set in ascending order, one Release each",
	"etcd-txn        raw etcd (primary): Txn(If CreateRevision==0 Then Put with lease) + Delete; waiters watch the key; death = lease revoke",
	"etcd-mutex      go.etcd.io/etcd/client/v3/concurrency.Mutex, one concurrency.Session per client (reference only, not a target)",
	"etcd-election   election: go.etcd.io/etcd/client/v3/concurrency.Election (Campaign, Resign, Observe), one concurrency.Session per candidate (primary election baseline)",
	"etcd-sem        semaphore: raw etcd N-slot recipe: a waiter key per client on its lease, ranked by create revision; a slot while fewer than N keys " +
		"rank ahead, else watch deletes (from now, so etcd serves the watcher at once), then read the keys ahead and wait until fewer than N are left; free = delete",
	"etcd-session    idle: one clientv3 concurrency.Session per session on one clientv3 client; cpu = the etcd process (and, client cpu, the bench process)",
	"pg-session      idle: a row per session (id, expires_at; index on expires_at) renewed by one UPDATE ... WHERE id = ANY($1) per TTL/3, " +
		"expired rows deleted every 1 s, both on one connection of the bench process; cpu = the PostgreSQL backend serving it",
	"pg-raw          raw PostgreSQL (primary): sessions table + ON DELETE CASCADE; INSERT ... ON CONFLICT DO NOTHING RETURNING nextval + DELETE ... AND token; " +
		"waiters poll every 2-10 ms; pgxpool of exactly c connections, all opened before the clock starts",
	"pg-sem          semaphore: raw PostgreSQL N slot rows (sessions + ON DELETE SET NULL): UPDATE ... WHERE (sem, slot) = (SELECT ... " +
		"FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING nextval; no free slot: poll every 2-10 ms; pool of c connections",
	"pg-raw-min      as pg-raw with the minimal schema: one table, primary key only, client-chosen token, no sessions; pool of c connections",
	"pg-raw-defpool  pg-raw through pgxpool's default pool from the DSN (size in the backend line), shared by all clients",
	"fsync-4k        ceiling: 4 KiB pwrite + fdatasync loop per worker, on a file in the backend's data directory",
	"etcd-put        ceiling: etcd Put of a key per worker",
	"pg-insert       ceiling: autocommit INSERT into an index-free table, one connection per worker",
}

// legendFor reports whether the legend line of name belongs to a report of
// backend.
func legendFor(name, backend string) bool {
	switch {
	case name == sysLockd || name == ceilFsync || strings.HasPrefix(name, "lockd-"):
		return true
	case backend == BackendPG:
		return strings.HasPrefix(name, "pg-")
	}
	return strings.HasPrefix(name, "etcd-")
}

// WriteTable writes the report as a header and an aligned table.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	m, s := r.Machine, r.Settings
	fmt.Fprintf(&b, "lockd bench  %s  (took %s)\n", r.Start.UTC().Format(time.RFC3339), r.Took)
	fmt.Fprintf(&b, "machine:   %s, %s, nproc %d, GOMAXPROCS %d, %s %s\n", m.Hostname, orDash(m.CPUModel), m.NumCPU, m.GOMAXPROCS, m.GoVersion, m.OSArch)
	if m.LoadStart != "" {
		fmt.Fprintf(&b, "load avg:  start %s, end %s\n", m.LoadStart, m.LoadEnd)
	}
	fmt.Fprintf(&b, "backend:   %s", s.Backend)
	if s.BackendVersion != "" {
		fmt.Fprintf(&b, " (%s)", s.BackendVersion)
	}
	if s.PGPoolMaxConns > 0 {
		fmt.Fprintf(&b, ", lockd's pool %d conns (lock.pg.max-conns), pgxpool default %d conns (pg-raw-defpool); pg-raw, pg-raw-min and pg-insert get c conns",
			s.LockdPGMaxConns, s.PGPoolMaxConns)
	}
	if s.BackendProcess != "" {
		fmt.Fprintf(&b, "\nprocess:   %s", s.BackendProcess)
	}
	if s.Durability != "" {
		fmt.Fprintf(&b, "\ndurable:   %s", s.Durability)
	}
	if s.DataDir != "" {
		fmt.Fprintf(&b, "\ndata dir:  %s on %s", s.DataDir, s.DataDirFS)
		if s.DataDirNote != "" {
			fmt.Fprintf(&b, " (%s)", s.DataDirNote)
		}
	}
	fmt.Fprintf(&b, "\nsettings:  %s per measurement, %d rounds (%s), scenarios %s, session TTL %s\n",
		s.Duration, s.Rounds, orDash(s.SystemOrder), strings.Join(s.Scenarios, ","), s.SessionTTL)
	if s.Processes != "" {
		fmt.Fprintf(&b, "processes: %s\n", s.Processes)
	}
	if len(s.ScaleSessions) > 0 {
		fmt.Fprintf(&b, "scale:     sessions %s x replicas %s, %s per point, on a 3-member etcd of its own\n",
			joinInts(s.ScaleSessions), joinInts(s.ScaleReplicas), s.ScaleDuration)
	}
	b.WriteString("figures:   rates, fairness and death times are medians over rounds; latencies are percentiles of all pairs\n")
	for _, l := range systemLegend {
		name, _, _ := strings.Cut(l, " ")
		if legendFor(name, s.Backend) {
			b.WriteString("  " + l + "\n")
		}
	}
	if slices.ContainsFunc(r.Rows, func(row Row) bool { return row.SDK != "" }) {
		for _, l := range sdkLegend {
			b.WriteString("  " + l + "\n")
		}
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tC/N\tMETRIC\tLOCKD\tBASELINE\tRAW\tLOCKD/RAW\tLOCKD%CEIL\tRAW%CEIL\tTARGET\tFLAGS")
	for _, row := range r.Rows {
		cn := "-"
		switch {
		case row.Concurrency > 0:
			cn = "c=" + strconv.Itoa(row.Concurrency)
		case row.N > 0:
			cn = "N=" + strconv.Itoa(row.N)
		}
		if row.Replicas > 0 {
			cn += " R=" + strconv.Itoa(row.Replicas)
		}
		raw, ratio := "-", "-"
		if row.Raw != nil {
			raw = row.Raw.String()
		}
		if row.Ratio != nil {
			ratio = row.Ratio.String()
		}
		target := row.Target
		if row.Met != nil {
			if *row.Met {
				target += " met"
			} else {
				target += " MISSED"
			}
		}
		lceil, rceil := "-", "-"
		if row.LockdCeil != nil {
			lceil = row.LockdCeil.String() + "%"
		}
		if row.RawCeil != nil {
			rceil = row.RawCeil.String() + "%"
		}
		scenario := row.Scenario
		if row.SDK != "" {
			scenario += " sdk=" + row.SDK
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", scenario, cn, row.Metric, row.Lockd,
			orDash(row.Baseline), raw, ratio, lceil, rceil, orDash(target), orDash(strings.Join(row.Flags, "; ")))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("bench: write table: %w", err)
	}
	notes := slices.Clone(r.Notes)
	for _, row := range r.Rows {
		if row.Note != "" && !slices.Contains(notes, row.Note) {
			notes = append(notes, row.Note)
		}
	}
	if len(notes) > 0 {
		b.WriteString("\nnotes:\n")
		for _, n := range notes {
			b.WriteString("  " + n + "\n")
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("bench: write table: %w", err)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// joinInts writes ns comma-separated.
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
