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
)

// Row is one line of the report: one lockd figure, and the same figure of
// one baseline with the ratio lockd / baseline when the scenario has one.
type Row struct {
	Scenario string `json:"scenario"`
	// Concurrency is the number of clients (distinct, contended).
	Concurrency int `json:"concurrency,omitempty"`
	// N is the number of locks (death) or sessions (idle).
	N      int    `json:"n,omitempty"`
	Metric string `json:"metric"`
	Lockd  Value  `json:"lockd"`
	// Baseline names the system compared with ("" when there is none).
	Baseline string `json:"baseline,omitempty"`
	Raw      *Value `json:"raw,omitempty"`
	// Ratio is Lockd / Raw.
	Ratio *Value `json:"ratio,omitempty"`
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
	Backend              string   `json:"backend"`
	BackendVersion       string   `json:"backend_version,omitempty"`
	Duration             string   `json:"duration"`
	Rounds               int      `json:"rounds"`
	Scenarios            []string `json:"scenarios"`
	DistinctConcurrency  []int    `json:"distinct_concurrency"`
	ContendedConcurrency []int    `json:"contended_concurrency"`
	DeathLocks           []int    `json:"death_locks"`
	IdleSessions         int      `json:"idle_sessions"`
	IdleDuration         string   `json:"idle_duration"`
	SessionTTL           string   `json:"session_ttl"`
	PGPoolMaxConns       int      `json:"pg_pool_max_conns,omitempty"`
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
	"lockd       lockd gRPC server in this process (127.0.0.1) + Go SDK, one session per client",
	"etcd-txn    raw etcd: Txn(If CreateRevision==0 Then Put with lease) + Delete; waiters watch the key; death = lease revoke",
	"etcd-mutex  go.etcd.io/etcd/client/v3/concurrency.Mutex, one concurrency.Session per client",
	"pg-raw      raw PostgreSQL: INSERT ... ON CONFLICT DO NOTHING RETURNING nextval + DELETE ... AND token; waiters poll every 2-10 ms; death = ON DELETE CASCADE",
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
		fmt.Fprintf(&b, ", pgxpool max %d conns for lockd and pg-raw alike", s.PGPoolMaxConns)
	}
	fmt.Fprintf(&b, "\nsettings:  %s per measurement, %d rounds alternating systems, scenarios %s, session TTL %s\n",
		s.Duration, s.Rounds, strings.Join(s.Scenarios, ","), s.SessionTTL)
	b.WriteString("figures:   rates, fairness and death times are medians over rounds; latencies are percentiles of all pairs\n")
	for _, l := range systemLegend {
		name, _, _ := strings.Cut(l, " ")
		if name == sysLockd || (s.Backend == BackendPG) == (name == sysPGRaw) {
			b.WriteString("  " + l + "\n")
		}
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tC/N\tMETRIC\tLOCKD\tBASELINE\tRAW\tLOCKD/RAW\tTARGET")
	for _, row := range r.Rows {
		cn := "-"
		switch {
		case row.Concurrency > 0:
			cn = "c=" + strconv.Itoa(row.Concurrency)
		case row.N > 0:
			cn = "N=" + strconv.Itoa(row.N)
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", row.Scenario, cn, row.Metric, row.Lockd,
			orDash(row.Baseline), raw, ratio, orDash(target))
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
