package runner

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"lock.dev/lockd/test/chaos/check"
	"lock.dev/lockd/test/chaos/history"
)

// Report is what one scenario recorded and what the checkers found.
type Report struct {
	Spec Spec
	// Acquisitions counts granted acquires (OK), Writes the writes the
	// fenced resource accepted, Rejected those its token check refused.
	Acquisitions, Writes, Rejected int
	// RejectedByPG counts, of Rejected, the writes the shipped PostgreSQL
	// fence (fence/fencepg) refused.
	RejectedByPG int
	// Faults counts the faults injected.
	Faults int
	// The checkers' results.
	Fenced, Overlapping, Linearizable, Trusted, Tokens check.Result
	Liveness                                           check.LivenessResult
	// Recovery: every key granted again within the bound after each fault
	// ended (check.Recovery).
	Recovery check.RecoveryResult
	// Deadlock: every cycle of waits answered within the bound
	// (check.DeadlocksResolved; DeadlockPairs only).
	Deadlock check.DeadlockResult
	// Pauses counts the pauses of holders, PauseHits what
	// check.PausesHitHolders found about them.
	Pauses    int
	PauseHits check.Result
	// ReleaseP99 and ReleaseMax are over the Release calls that succeeded
	// (send to reply).
	ReleaseP99, ReleaseMax time.Duration
	// Lost counts the grants whose trust ended otherwise than by their
	// release (lost ops: Done closed, deadline passed, release refused);
	// the replica scenarios (Spec.keepsSessions) must have none.
	Lost int
	// Problems are harness observations that fail a scenario (a worker
	// that had to be killed at the end).
	Problems []string
	// Wall is the scenario's wall time, setup and checks included.
	Wall time.Duration
	// Multi scenarios (multi.go): the keys' kinds, the checkers per key,
	// and LinSkipped (linearizability is the plain lock's model).
	Kinds      map[string]check.Kind
	PerKey     map[string]KeyChecks
	LinSkipped bool
}

// evaluate reads what the run recorded and runs every checker.
func (r *run) evaluate() (*Report, error) { return r.evaluateWith(true) }

// evaluateWith is evaluate, with the linearizability search only if lin
// (no control's verdict needs it, and it is the one slow checker).
func (r *run) evaluateWith(lin bool) (*Report, error) {
	h, err := history.ReadDir(r.histDir, "*.jsonl")
	if err != nil {
		return nil, fmt.Errorf("read histories: %w", err)
	}
	writes := r.fenced.Writes()
	rep := &Report{Spec: r.spec, Writes: len(writes), Rejected: r.fenced.Rejected(), RejectedByPG: r.fenced.RejectedByPG(), Faults: r.faults,
		Problems: r.problems, Pauses: len(r.pauses)}
	var rel []time.Duration
	for _, op := range h {
		switch {
		case op.Kind == history.Acquire && op.Outcome == history.OK:
			rep.Acquisitions++
		case op.Kind == history.Release && op.Outcome == history.OK:
			rel = append(rel, time.Duration(op.Complete-op.Invoke))
		case op.Kind == history.Lost:
			rep.Lost++
		}
	}
	slices.Sort(rel)
	if n := len(rel); n > 0 {
		rep.ReleaseP99, rep.ReleaseMax = rel[max((99*n+99)/100, 1)-1], rel[n-1]
	}
	rep.Fenced = check.FencedSafety(writes)
	rep.Overlapping = check.OverlappingWriters(writes)
	if lin {
		rep.Linearizable = check.Linearizable(h, check.LinOptions{Timeout: r.opts.LinTimeout,
			VisualizeDir: r.dir})
	}
	rep.Trusted = check.NoTrustedOverlap(h)
	rep.Tokens = check.TokensIncrease(h)
	deaths := append(append([]check.Death(nil), r.deaths...), check.DeathsOf(h)...)
	rep.Liveness = check.Liveness(check.HandOvers(h, deaths), r.livenessBound())
	rep.Recovery = check.Recovery(h, r.windows, r.livenessBound())
	rep.PauseHits = check.PausesHitHolders(h, r.pauses)
	if r.multi() {
		r.evaluateMulti(rep, h, writes)
	}
	if r.deadlocks() {
		rep.Deadlock = check.DeadlocksResolved(h, r.deadlockBound())
	}
	return rep, nil
}

// reaperBound is the "reaper interval" of the liveness bound: how late
// after a session's expiry its locks are freed. lockd's silence closer frees
// them at once; the backend's own expiry (etcd checks leases every 500ms,
// PostgreSQL's reaper runs every Options.Reaper) is the later one.
func (r *run) reaperBound() time.Duration {
	if r.spec.Backend == PG {
		return r.opts.Reaper
	}
	return 500 * time.Millisecond
}

// Verdict says whether the scenario passed. A real scenario passes when
// every checker found nothing and decided; a control passes when its
// checker found the violation it must find.
func (rep *Report) Verdict() (ok bool, why string) {
	if len(rep.Problems) > 0 {
		return false, "harness: " + strings.Join(rep.Problems, "; ")
	}
	if rep.Acquisitions == 0 {
		return false, "no acquisitions"
	}
	if !rep.Spec.judgedReal() {
		return rep.controlVerdict()
	}
	var bad []string
	for _, res := range rep.results() {
		if !res.OK() {
			bad = append(bad, res.Checker)
		}
	}
	if rep.Faults == 0 {
		bad = append(bad, "no fault injected")
	}
	if rep.Spec.keepsSessions() && rep.Lost > 0 {
		bad = append(bad, fmt.Sprintf("%d grants lost (sessions must survive the replica)", rep.Lost))
	}
	if rep.Spec.pausesHolders() {
		if rep.Pauses == 0 {
			bad = append(bad, "no holder paused")
		}
		if rep.Rejected < rep.Pauses {
			bad = append(bad, fmt.Sprintf("%d refused writes < %d pauses", rep.Rejected, rep.Pauses))
		}
	}
	if len(bad) > 0 {
		why := "failed: " + strings.Join(bad, ", ")
		if rep.Spec.Pending != "" {
			why += " (pending: " + rep.Spec.Pending + ")"
		}
		return false, why
	}
	return true, "pass"
}

// controlVerdict is the verdict of a control with its break on: whether
// the checkers it was built for found their violations. It reads only
// their results, so it also judges a run in progress (run.caught).
func (rep *Report) controlVerdict() (ok bool, why string) {
	switch rep.Spec.Control {
	case FencingOff:
		if rep.Overlapping.Violations == 0 {
			return false, "control did not fail: no overlapping writers with the token check off"
		}
		if rep.PauseHits.Violations == 0 {
			// The pause check's own control: no late write was refused.
			return false, "control did not fail: the pause check found every pause's late write refused with the token check off"
		}
		return true, "control failed as it must"
	case ReceiveTTL, SlowClock, RecvTimeSDK, StaleRecord:
		if rep.Trusted.Violations == 0 {
			return false, "control did not fail: no trusted overlap"
		}
		return true, "control failed as it must"
	case SemExtra, IgnoreDone:
		return rep.multiVerdict()
	case DeadlockOff:
		if rep.Deadlock.Violations == 0 {
			return false, "control did not fail: every cycle of waits was answered within the bound with the detector off"
		}
		return true, "control failed as it must"
	case NoHeal, NoSync:
		if rep.Recovery.Violations == 0 {
			return false, "control did not fail: every key was granted again within the bound"
		}
		return true, "control failed as it must"
	}
	return false, fmt.Sprintf("unknown control %q", rep.Spec.Control)
}

// Details renders every checker's result, for logs.
func (rep *Report) Details() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fenced resource: %d writes accepted, %d refused by the token check (%d by the PostgreSQL fence, fence/fencepg)\n",
		rep.Writes, rep.Rejected, rep.RejectedByPG)
	fmt.Fprintf(&b, "grants lost (trust ended otherwise than by the release): %d\n", rep.Lost)
	for _, res := range []check.Result{rep.Fenced, rep.Overlapping, rep.Linearizable, rep.Trusted, rep.Tokens,
		rep.PauseHits} {
		b.WriteString(res.String())
		b.WriteByte('\n')
	}
	b.WriteString(rep.Liveness.String())
	b.WriteByte('\n')
	b.WriteString(rep.Recovery.String())
	if rep.Spec.Fault == DeadlockPairs {
		b.WriteByte('\n')
		b.WriteString(rep.Deadlock.String())
	}
	for _, key := range slices.Sorted(maps.Keys(rep.PerKey)) {
		kc := rep.PerKey[key]
		fmt.Fprintf(&b, "\nkey %q (%s):", key, rep.Kinds[key])
		for _, res := range []check.Result{kc.Fenced, kc.Writers, kc.Trusted} {
			b.WriteString("\n  ")
			b.WriteString(strings.ReplaceAll(res.String(), "\n", "\n  "))
		}
	}
	return b.String()
}

// viol renders a violation count ("?" when the checker could not decide).
func viol(res check.Result) string {
	if res.Inconclusive {
		return fmt.Sprintf("%d?", res.Violations)
	}
	return fmt.Sprint(res.Violations)
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.0f", float64(d)/float64(time.Millisecond))
}

// Legend explains Table's columns.
const Legend = `columns: acq = granted acquisitions; faults = faults injected; violations per checker: stale = stale
writes the fenced resource accepted (fenced safety), overlap-w = overlapping writers, lin = histories not
linearizable (per key; "-" for semaphores and read/write locks), trusted-ovl = overlapping trust intervals
(more than a semaphore's N, or an exclusive grant with another), tokens = token order, liveness = waiters kept
out of a dead holder's key past TTL + reaper + slack ("N?" = undecided), recover = keys not granted again
within TTL + reaper + slack after a fault ended, pauses = holder pauses whose late write the token check
refused / pauses (pause faults only); refused = writes the fenced resource refused for a stale token (pg: of
them, those the shipped PostgreSQL fence, fence/fencepg, refused: plain locks' writes); handover = delay from a
holder's death to the next grant; regrant = delay from a fault's end to each key's next grant; release = Release call latency. Semaphore and read/write keys
(multi-*): overlap-w counts writers acting beyond the key's kind, stale follows the resource's shared and
exclusive rules, a semaphore slot's write is checked against lockd's holders (test/chaos/fenced).
`

// Table renders one row per report: the scenario, its backend and fault,
// acquisitions, faults injected, violations per checker (fenced safety,
// overlapping writers, linearizability, trusted overlap, token order,
// liveness), the hand-over delay after a holder's death (p50/p99/max, ms),
// the Release latency (p99/max, ms) and the verdict.
func Table(reps []*Report) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tbackend\tfault\tacq\tfaults\tstale\toverlap-w\tlin\ttrusted-ovl\ttokens\tliveness\trecover\tpauses\trefused (pg)\thandover p50/p99/max ms\tregrant p99/max ms\trelease p99/max ms\tverdict")
	for _, rep := range reps {
		ok, why := rep.Verdict()
		verdict := "PASS"
		switch {
		case !ok:
			verdict = "FAIL: " + why
		case rep.Spec.BreakOff:
			verdict = "PASS (control " + string(rep.Spec.Control) + " with its break off: nothing found)"
		case rep.Spec.Control != NoControl:
			verdict = "PASS (control " + string(rep.Spec.Control) + " caught)"
		}
		handover := "-"
		if lr := rep.Liveness; lr.Granted > 0 {
			handover = fmt.Sprintf("%s/%s/%s", ms(lr.P50), ms(lr.P99), ms(lr.Max))
		}
		regrant := "-"
		if rr := rep.Recovery; rr.Granted > 0 {
			regrant = fmt.Sprintf("%s/%s", ms(rr.P99), ms(rr.Max))
		}
		lin := viol(rep.Linearizable)
		if rep.LinSkipped {
			lin = "-"
		}
		pauses := "-"
		if rep.Spec.pausesHolders() {
			pauses = fmt.Sprintf("%d/%d", rep.Pauses-rep.PauseHits.Violations, rep.Pauses)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d (%d)\t%s\t%s\t%s/%s\t%s\n",
			rep.Spec.Name, rep.Spec.Backend, rep.Spec.Fault, rep.Acquisitions, rep.Faults,
			viol(rep.Fenced), viol(rep.Overlapping), lin, viol(rep.Trusted), viol(rep.Tokens),
			viol(rep.Liveness.Result), viol(rep.Recovery.Result), pauses, rep.Rejected, rep.RejectedByPG, handover, regrant,
			ms(rep.ReleaseP99), ms(rep.ReleaseMax), verdict)
	}
	_ = tw.Flush()
	return b.String()
}

// family groups backends for the totals: every etcd flavour is etcd.
func family(b Backend) string {
	if b == PG {
		return "pg"
	}
	return "etcd"
}

// Totals renders, per backend family, the acquisitions and faults of the
// real scenarios (controls aside) and their violations over all checkers.
func Totals(reps []*Report) string {
	type sum struct{ acq, faults, viol, scen int }
	sums := map[string]*sum{}
	var fams []string
	for _, rep := range reps {
		if rep.Spec.Control != NoControl {
			continue
		}
		f := family(rep.Spec.Backend)
		s := sums[f]
		if s == nil {
			s = &sum{}
			sums[f] = s
			fams = append(fams, f)
		}
		s.scen++
		s.acq += rep.Acquisitions
		s.faults += rep.Faults
		for _, res := range rep.results() {
			s.viol += res.Violations
		}
	}
	slices.Sort(fams)
	var b strings.Builder
	for _, f := range fams {
		s := sums[f]
		fmt.Fprintf(&b, "total %s: %d scenarios, %d fenced acquisitions, %d faults, %d violations\n",
			f, s.scen, s.acq, s.faults, s.viol)
	}
	return b.String()
}

// results are the checkers' results a real scenario must pass: the pause
// check only for the scenarios that pause holders.
func (rep *Report) results() []check.Result {
	rs := []check.Result{rep.Fenced, rep.Overlapping, rep.Linearizable, rep.Trusted, rep.Tokens,
		rep.Liveness.Result, rep.Recovery.Result}
	if rep.Spec.pausesHolders() {
		rs = append(rs, rep.PauseHits)
	}
	if rep.Spec.Fault == DeadlockPairs {
		rs = append(rs, rep.Deadlock.Result)
	}
	return rs
}

// pausesHolders reports whether the scenario is judged as a real one
// (judgedReal) and its faults are pauses of holders, each of which must
// hit a holder and end in a refused write.
func (s Spec) pausesHolders() bool {
	return s.judgedReal() && (s.Fault == PauseHolder || s.Fault == ClockSkew || s.Fault == FarHolder ||
		s.Fault == MultiPauseKill)
}
