package prefixstats

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

// TestTemplateMatch: a key counts under the first template whose segments
// match its leading segments, under Other when none does; by default under
// its first path segment.
func TestTemplateMatch(t *testing.T) {
	declared := []string{"jobs/*", "tenants/*/report", "tenants/*", "a/b/c", "*/x"}
	for _, c := range []struct {
		templates []string
		key, want string
	}{
		{declared, "jobs/7", "jobs/*"},
		{declared, "jobs/7/step/2", "jobs/*"},
		{declared, "jobs", Other},    // fewer segments than the template
		{declared, "jobs/", Other},   // * stands for a non-empty segment
		{declared, "jobsx/7", Other}, // literal segments match whole
		{declared, "batch/jobs/7", Other},
		{declared, "tenants/acme/report", "tenants/*/report"},
		{declared, "tenants/acme/report/2026", "tenants/*/report"},
		{declared, "tenants/acme/invoice", "tenants/*"}, // the first match wins, in list order
		{declared, "tenants/acme", "tenants/*"},
		{declared, "a/b/c", "a/b/c"},
		{declared, "a/b", Other},
		{declared, "a/b/cd", Other},
		{declared, "q/x/z", "*/x"},
		{declared, "leader", Other},
		{nil, "jobs/7", "jobs/*"},
		{nil, "jobs/7/step", "jobs/*"},
		{nil, "leader", Other}, // no /: no first path segment
		{nil, "/x", Other},
	} {
		s, err := New(nil, c.templates, true)
		if err != nil {
			t.Fatalf("New(%q): %v", c.templates, err)
		}
		if got := s.Name(s.Template(c.key)); got != c.want {
			t.Errorf("templates %q: key %q counts under %q; want %q", c.templates, c.key, got, c.want)
		}
	}
}

// TestNoSegments: without the first-segment default (the server's choice
// under an access policy) an undeclared key counts under Other; declared
// templates still match.
func TestNoSegments(t *testing.T) {
	for _, c := range []struct {
		templates []string
		key, want string
	}{
		{nil, "jobs/7", Other},
		{nil, "leader", Other},
		{[]string{"jobs/*"}, "jobs/7", "jobs/*"},
		{[]string{"jobs/*"}, "tenants/7", Other},
	} {
		s, err := New(nil, c.templates, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Name(s.Template(c.key)); got != c.want {
			t.Errorf("templates %q without segments: key %q counts under %q; want %q", c.templates, c.key, got, c.want)
		}
	}
}

// TestDefaultBound: the default takes the first MaxTemplates first segments
// it sees; later ones count under Other, earlier ones keep their template.
func TestDefaultBound(t *testing.T) {
	s, err := New(nil, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	for i := range MaxTemplates {
		key := fmt.Sprintf("seg%d/k", i)
		if got, want := s.Name(s.Template(key)), fmt.Sprintf("seg%d/*", i); got != want {
			t.Fatalf("key %q counts under %q; want %q", key, got, want)
		}
	}
	if got := s.Name(s.Template("late/k")); got != Other {
		t.Errorf("the %dth first segment counts under %q; want %q", MaxTemplates+1, got, Other)
	}
	if got := s.Name(s.Template("seg3/again")); got != "seg3/*" {
		t.Errorf("a known first segment counts under %q after the bound; want %q", got, "seg3/*")
	}
}

// TestValidate: the bound and the form of templates are checked when the
// configuration is read, with errors that name the problem.
func TestValidate(t *testing.T) {
	many := make([]string, MaxTemplates+1)
	for i := range many {
		many[i] = fmt.Sprintf("t%d/*", i)
	}
	if err := Validate(many[:MaxTemplates]); err != nil {
		t.Errorf("Validate(%d templates) = %v; want nil", MaxTemplates, err)
	}
	for _, c := range []struct {
		templates []string
		want      string
	}{
		{many, "33 templates; at most 32 (C4 #ct4-template-stats: 33 label values × 41 series = 1353 series)"},
		{[]string{""}, `template "": empty`},
		{[]string{"/jobs"}, "empty segment"},
		{[]string{"jobs/"}, "empty segment"},
		{[]string{"a//b"}, "empty segment"},
		{[]string{"job*/x"}, `segment "job*": * stands for a whole segment only`},
		{[]string{"other"}, `"other" is reserved`},
		{[]string{"a/*", "a/*"}, `template "a/*" is listed twice`},
		{[]string{strings.Repeat("a", MaxTemplateLen+1)}, "257 bytes; at most 256"},
		{[]string{"a\xff"}, "not valid UTF-8"},
	} {
		err := Validate(c.templates)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%.40q) = %v; want an error containing %q", c.templates, err, c.want)
		}
		if _, nerr := New(nil, c.templates, true); nerr == nil {
			t.Errorf("New(%.40q) succeeded; want the error of Validate", c.templates)
		}
	}
	if SeriesPerTemplate != 41 || MaxSeries != 1353 {
		t.Errorf("SeriesPerTemplate, MaxSeries = %d, %d; C4 states 41, 1353", SeriesPerTemplate, MaxSeries)
	}
}

// TestSeriesBound: 10 000 distinct keys, each under a first segment of its
// own (the default's worst case: a label per segment would make 10 000
// values), used by 1 000 sessions that each acquire, hold and release 200
// of them (200 000 observations of each histogram, every key by 20
// sessions);
// then the same under 32 declared templates. The gathered series stay within
// MaxSeries (C4 #ct4-template-stats) and no label value is a key. Sessions
// are no input of the statistics (no session label): keys are what could
// grow the series. (All 10 000 keys by each of the 1 000 sessions, 10 M
// observations per mode, would take over a minute under -race on a shared
// 2-core machine, 7 s per million, and show nothing more.)
func TestSeriesBound(t *testing.T) {
	const sessions, keys, perSession = 1000, 10_000, 200
	names := make([]string, keys)
	isKey := make(map[string]bool, keys)
	for k := range names {
		names[k] = fmt.Sprintf("t%d/job-%d", k, k)
		isKey[names[k]] = true
	}
	declared := make([]string, MaxTemplates)
	for i := range declared {
		declared[i] = fmt.Sprintf("t%d/*", i*7)
	}
	for _, templates := range [][]string{nil, declared} {
		reg := prometheus.NewRegistry()
		s, err := New(reg, templates, true)
		if err != nil {
			t.Fatal(err)
		}
		for sess := range sessions {
			for j := range perSession {
				k := (sess*perSession + j) % keys
				i := s.Template(names[k])
				s.Queued(i, j%300)
				s.Waited(i, time.Duration(j)*time.Millisecond)
				s.Held(i, time.Duration(sess)*time.Millisecond)
			}
		}
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		series, values := 0, map[string]bool{}
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				series += len(m.GetHistogram().GetBucket()) + 3
				for _, lp := range m.GetLabel() {
					values[lp.GetValue()] = true
					if isKey[lp.GetValue()] {
						t.Errorf("%s has label %s=%q, a key", f.GetName(), lp.GetName(), lp.GetValue())
					}
				}
			}
		}
		t.Logf("templates %d: %d sessions × %d keys → %d template values, %d series (bound %d)",
			len(templates), sessions, keys, len(values), series, MaxSeries)
		if series > MaxSeries || len(values) > MaxTemplates+1 {
			t.Errorf("templates %d: %d series, %d label values after %d keys; want <= %d series, <= %d values",
				len(templates), series, len(values), keys, MaxSeries, MaxTemplates+1)
		}
		if !values[Other] {
			t.Errorf("templates %d: no series for %q; keys beyond the templates must count there", len(templates), Other)
		}
	}
}

// TestObserveAllocations: matching a key and observing it allocate nothing
// once its template's series exist (the server's hot path).
func TestObserveAllocations(t *testing.T) {
	for _, templates := range [][]string{nil, {"jobs/*", "tenants/*/report"}} {
		s, err := New(prometheus.NewRegistry(), templates, true)
		if err != nil {
			t.Fatal(err)
		}
		observe := func() {
			i := s.Template("jobs/42/step")
			s.Waited(i, time.Millisecond)
			s.Held(i, time.Second)
			s.Queued(i, 3)
		}
		observe()
		if got := testing.AllocsPerRun(100, observe); got != 0 {
			t.Errorf("templates %q: %v allocations per observation; want 0", templates, got)
		}
	}
}

// TestNil: a nil *Stats records nothing and does not panic.
func TestNil(t *testing.T) {
	var s *Stats
	i := s.Template("jobs/1")
	s.Waited(i, time.Second)
	s.Held(i, time.Second)
	s.Queued(i, 1)
	if s.Name(i) != "" {
		t.Errorf("nil Stats names a template")
	}
}
