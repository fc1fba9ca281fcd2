package auth

import (
	"errors"
	"testing"
)

// FuzzParsePolicy feeds arbitrary bytes as a policy file. ParsePolicy must
// not panic; an error must be a *ParseError with a reason; a policy must
// decide without panicking, and only with its own rules' names.
func FuzzParsePolicy(f *testing.F) {
	f.Add([]byte(matrixPolicy))
	f.Add([]byte("rules: []\n"))
	f.Add([]byte("rules:\n  - principals: [\"*\"]\n    prefixes: [\"*\"]\n    allow: [read, lock, admin]\n"))
	f.Add([]byte("rules:\n  - name: x\n    principals: [a]\n    prefixes: [a/, b]\n    allow: [admin]\n"))
	f.Add([]byte("x: &a [1]\nrules: *a\n"))
	f.Add([]byte("rules:\n  - principals: [a\n"))
	f.Add([]byte("rules:\n  - name: w\n    principals: [a, b]\n    prefixes: [x/]\n    allow: [lock]\nlimits:\n  - rule: w\n    max-sessions: 3\n  - principals: [\"*\"]\n    max-connections: 2\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePolicy(data)
		if err != nil {
			pe, ok := errors.AsType[*ParseError](err)
			if !ok || pe.Reason == "" || pe.Line < 0 {
				t.Fatalf("ParsePolicy error %q (%T) is not a *ParseError with a reason", err, err)
			}
			return
		}
		names := map[string]bool{RuleDefaultDeny: true}
		for _, r := range p.Rules() {
			if len(r.Principals) == 0 || len(r.Prefixes) == 0 || len(r.Allow) == 0 || r.Name == "" {
				t.Fatalf("rule %+v has an empty part", r)
			}
			names[r.Name] = true
		}
		for _, e := range p.Limits() {
			if len(e.Principals) == 0 || len(e.Values) == 0 {
				t.Fatalf("limits entry %+v names no principal or sets nothing", e)
			}
		}
		for _, k := range LimitKeys() {
			if n, _, ok := p.Limit("a", k); ok && (n < 1 || n > MaxLimitValue) {
				t.Fatalf("Limit(a, %s) = %d, out of bounds", k, n)
			}
		}
		for _, a := range []Action{ActionRead, ActionLock, ActionAdmin} {
			for _, k := range []string{"", "a", "a/x", "ab", "*"} {
				if _, rule := p.Decide("a", a, k); !names[rule] {
					t.Fatalf("Decide reported rule %q, not in the policy", rule)
				}
				all, some, rule := p.Scope("a", a, k)
				if !names[rule] || all && !some {
					t.Fatalf("Scope = %v, %v, %q", all, some, rule)
				}
			}
		}
	})
}
