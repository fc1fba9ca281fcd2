package auth

import (
	"errors"
	"strings"
	"testing"
)

const limitsPolicy = `
rules:
  - name: workers
    principals: [alice, bob]
    prefixes: ["jobs/"]
    allow: [read, lock]
  - name: all-read
    principals: ["*"]
    prefixes: ["pub/"]
    allow: [read]
limits:
  - rule: workers
    max-sessions: 100
  - principals: [alice]
    max-connections: 8
    max-sessions: 7
  - principals: ["*"]
    max-inflight: 50
  - principals: [anonymous]
    max-session-opens: 2
`

// TestPolicyLimits: the first entry in file order that names the principal
// and sets the key decides; a rule's entry names its principals; "*" names
// every authenticated principal, not anonymous; keys no entry sets are the
// server's.
func TestPolicyLimits(t *testing.T) {
	p := mustPolicy(t, limitsPolicy)
	for _, c := range []struct {
		principal string
		key       LimitKey
		n, line   int
		ok        bool
	}{
		{"alice", LimitSessions, 100, 12, true}, // the rule's entry comes first
		{"alice", LimitConnections, 8, 14, true},
		{"bob", LimitConnections, 0, 0, false},
		{"bob", LimitSessions, 100, 12, true},
		{"carol", LimitSessions, 0, 0, false},
		{"carol", LimitInflight, 50, 17, true},
		{"anonymous", LimitInflight, 0, 0, false},
		{"anonymous", LimitSessionOpens, 2, 19, true},
		{"alice", LimitWatches, 0, 0, false},
	} {
		n, line, ok := p.Limit(c.principal, c.key)
		if n != c.n || line != c.line || ok != c.ok {
			t.Errorf("Limit(%s, %s) = %d, line %d, %v; want %d, line %d, %v", c.principal, c.key, n, line, ok, c.n, c.line, c.ok)
		}
	}
	var nilPolicy *Policy
	if _, _, ok := nilPolicy.Limit("alice", LimitSessions); ok {
		t.Error("a nil policy sets a limit")
	}
	for principal, want := range map[string]bool{"alice": true, "carol": true, "anonymous": false} {
		if got := p.Names(principal); got != want {
			t.Errorf("Names(%s) = %v; want %v", principal, got, want)
		}
	}
	if !nilPolicy.Names("mallory") {
		t.Error("a nil policy does not name mallory")
	}
}

// TestPolicyLimitsMalformed: every malformed limits: entry is a
// *ParseError naming its line.
func TestPolicyLimitsMalformed(t *testing.T) {
	const rules = "rules:\n  - name: w\n    principals: [a]\n    prefixes: [x/]\n    allow: [lock]\n"
	for _, c := range []struct{ name, limits, want string }{
		{"not a list", "limits: {a: 1}\n", "want a list"},
		{"not a mapping", "limits: [1]\n", "want a mapping"},
		{"neither", "limits:\n  - max-sessions: 1\n", "exactly one of principals and rule"},
		{"both", "limits:\n  - rule: w\n    principals: [a]\n    max-sessions: 1\n", "exactly one of principals and rule"},
		{"unknown rule", "limits:\n  - rule: nope\n    max-sessions: 1\n", `no rule is named "nope"`},
		{"unknown key", "limits:\n  - rule: w\n    max-locks: 1\n", `unknown key "max-locks"`},
		{"zero", "limits:\n  - rule: w\n    max-sessions: 0\n", "want an integer 1..1000000"},
		{"too big", "limits:\n  - rule: w\n    max-sessions: 1000001\n", "want an integer 1..1000000"},
		{"string", "limits:\n  - rule: w\n    max-sessions: \"5\"\n", "want an integer"},
		{"empty", "limits:\n  - rule: w\n", "sets no limit"},
		{"empty principals", "limits:\n  - principals: []\n    max-sessions: 1\n", "the list is empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParsePolicy([]byte(rules + c.limits))
			pe, ok := errors.AsType[*ParseError](err)
			if !ok || pe.Line < 6 || !strings.Contains(pe.Reason, c.want) {
				t.Errorf("ParsePolicy = %v; want a *ParseError from line 6 on containing %q", err, c.want)
			}
		})
	}
}
