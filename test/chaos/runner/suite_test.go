package runner

import (
	"strings"
	"testing"
)

// TestCISuite: the short suite `make test` runs (CISuite) keeps at least one
// scenario of every fault kind of Suite, every control, and every backend;
// every ChaosOnly name is a scenario of Suite (a renamed scenario would
// otherwise come back into make test unnoticed) and says which scenario of
// CISuite keeps its fault kind, one that CISuite has, with the same fault.
func TestCISuite(t *testing.T) {
	ci := map[string]Spec{}
	faults, backends := map[Fault]bool{}, map[Backend]bool{}
	for _, s := range CISuite() {
		ci[s.Name] = s
		faults[s.Fault] = true
		backends[s.Backend] = true
	}
	all := map[string]Spec{}
	for _, s := range Suite() {
		all[s.Name] = s
		if !faults[s.Fault] {
			t.Errorf("fault %q (scenario %s) has no scenario in CISuite", s.Fault, s.Name)
		}
		if !backends[s.Backend] {
			t.Errorf("backend %q (scenario %s) has no scenario in CISuite", s.Backend, s.Name)
		}
		if _, in := ci[s.Name]; s.Control != NoControl && !in {
			t.Errorf("control %s is not in CISuite; every control runs in make test", s.Name)
		}
	}
	for name, why := range ChaosOnly {
		s, ok := all[name]
		if !ok {
			t.Errorf("ChaosOnly names %q, which is not a scenario of Suite", name)
			continue
		}
		kept, _, _ := strings.Cut(why, ":")
		k, ok := ci[kept]
		if !ok || k.Fault != s.Fault || k.Control != NoControl {
			t.Errorf("ChaosOnly[%q] = %q: want the name of the CISuite scenario without a control that keeps fault %q, then ':' and why", name, why, s.Fault)
		}
	}
	if len(ci)+len(ChaosOnly) != len(all) {
		t.Errorf("CISuite %d + ChaosOnly %d scenarios, Suite %d", len(ci), len(ChaosOnly), len(all))
	}
}
