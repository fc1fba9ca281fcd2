package check

import (
	"fmt"
	"strings"
)

// MaxDetails is how many violation details a Result keeps; the rest are
// counted in a final "... and N more" line.
const MaxDetails = 25

// Result is what a checker found.
type Result struct {
	// Checker names the checker, e.g. "fenced-safety".
	Checker string
	// Violations counts the violations found. Zero means the property held
	// on this history (unless Inconclusive).
	Violations int
	// Inconclusive is set when the checker could not decide (the
	// linearizability search timed out). It is not a pass.
	Inconclusive bool
	// Details describe the violations for humans, at most MaxDetails+1
	// lines.
	Details []string
	// Notes are observations that are not violations (e.g. how many items
	// were checked), for the report.
	Notes []string
}

// OK reports whether the property held: no violation and a decision.
func (r Result) OK() bool { return r.Violations == 0 && !r.Inconclusive }

// String renders the result on several lines.
func (r Result) String() string {
	var b strings.Builder
	verdict := "ok"
	switch {
	case r.Violations > 0:
		verdict = fmt.Sprintf("%d violation(s)", r.Violations)
	case r.Inconclusive:
		verdict = "inconclusive"
	}
	fmt.Fprintf(&b, "%s: %s", r.Checker, verdict)
	for _, d := range r.Details {
		b.WriteString("\n  ")
		b.WriteString(d)
	}
	for _, n := range r.Notes {
		b.WriteString("\n  note: ")
		b.WriteString(n)
	}
	return b.String()
}

// violation counts one violation and keeps its description.
func (r *Result) violation(format string, args ...any) {
	r.Violations++
	switch {
	case len(r.Details) < MaxDetails:
		r.Details = append(r.Details, fmt.Sprintf(format, args...))
	case len(r.Details) == MaxDetails:
		r.Details = append(r.Details, "")
		fallthrough
	default:
		r.Details[MaxDetails] = fmt.Sprintf("... and %d more", r.Violations-MaxDetails)
	}
}

func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}
