package auth

import (
	"errors"
	"strings"
	"testing"
)

const matrixPolicy = `
rules:
  - name: a-readers
    principals: [reader, "spiffe://example.org/ns/prod/sa/billing"]
    prefixes: ["a/"]
    allow: [read]
  - name: a-lockers
    principals: [locker]
    prefixes: [a]
    allow: [lock]
  - name: a-admins
    principals: [admin]
    prefixes: ["a"]
    allow: [admin]
  - name: everyone-reads-pub
    principals: ["*"]
    prefixes: [pub/]
    allow: [read]
  - name: anonymous-health
    principals: [anonymous]
    prefixes: [open]
    allow: [read]
`

func mustPolicy(t *testing.T, src string) *Policy {
	t.Helper()
	p, err := ParsePolicy([]byte(src))
	if err != nil {
		t.Fatalf("ParsePolicy: %v", err)
	}
	return p
}

// TestDecide is the decision table: whole path segments, independent
// actions, "*" and anonymous, the reported rule.
func TestDecide(t *testing.T) {
	p := mustPolicy(t, matrixPolicy)
	for _, c := range []struct {
		principal string
		action    Action
		key       string
		allowed   bool
		rule      string
	}{
		{"reader", ActionRead, "a/x", true, "a-readers"},
		{"reader", ActionRead, "a", true, "a-readers"},
		{"reader", ActionRead, "a/", true, "a-readers"},
		{"reader", ActionRead, "a/x/y/z", true, "a-readers"},
		{"reader", ActionRead, "ab", false, RuleDefaultDeny},
		{"reader", ActionRead, "ab/x", false, RuleDefaultDeny},
		{"reader", ActionRead, "b/a/x", false, RuleDefaultDeny},
		{"reader", ActionLock, "a/x", false, RuleDefaultDeny},
		{"reader", ActionAdmin, "a/x", false, RuleDefaultDeny},
		{"spiffe://example.org/ns/prod/sa/billing", ActionRead, "a/x", true, "a-readers"},
		{"locker", ActionLock, "a/x", true, "a-lockers"},
		{"locker", ActionLock, "ab/x", false, RuleDefaultDeny},
		{"locker", ActionRead, "a/x", false, RuleDefaultDeny},
		{"locker", ActionLock, "", true, "a-lockers"}, // session calls: lock on some key
		{"reader", ActionLock, "", false, RuleDefaultDeny},
		{"admin", ActionAdmin, "a/x", true, "a-admins"},
		{"admin", ActionAdmin, "abc", false, RuleDefaultDeny},
		{"admin", ActionRead, "a/x", false, RuleDefaultDeny}, // admin implies nothing else
		{"admin", ActionRead, "pub/x", true, "everyone-reads-pub"},
		{"someone", ActionRead, "pub/x", true, "everyone-reads-pub"},
		{"someone", ActionRead, "pubx", false, RuleDefaultDeny},
		{Anonymous, ActionRead, "pub/x", false, RuleDefaultDeny}, // "*" is the authenticated only
		{Anonymous, ActionRead, "open/x", true, "anonymous-health"},
		{"someone", ActionRead, "open/x", false, RuleDefaultDeny},
		{"Reader", ActionRead, "a/x", false, RuleDefaultDeny}, // exact names
	} {
		allowed, rule := p.Decide(c.principal, c.action, c.key)
		if allowed != c.allowed || rule != c.rule {
			t.Errorf("Decide(%q, %s, %q) = %v, %q; want %v, %q", c.principal, c.action, c.key, allowed, rule, c.allowed, c.rule)
		}
	}
	var none *Policy
	if allowed, rule := none.Decide(Anonymous, ActionAdmin, "x"); !allowed || rule != RuleNoPolicy {
		t.Errorf("nil policy: Decide = %v, %q; want true, %q", allowed, rule, RuleNoPolicy)
	}
	empty := mustPolicy(t, "rules: []\n")
	if allowed, rule := empty.Decide("x", ActionRead, "x"); allowed || rule != RuleDefaultDeny {
		t.Errorf("empty policy: Decide = %v, %q; want false, %q", allowed, rule, RuleDefaultDeny)
	}
}

// TestScope: List/Watch prefixes covered entirely, partly (filtered) or not
// at all.
func TestScope(t *testing.T) {
	p := mustPolicy(t, matrixPolicy+`
  - name: star
    principals: [root]
    prefixes: ["*"]
    allow: [read]
  - name: ab-readers
    principals: [reader]
    prefixes: [ab]
    allow: [read]
`)
	for _, c := range []struct {
		principal, prefix string
		all, some         bool
		rule              string
	}{
		{"reader", "a/", true, true, "a-readers"},
		{"reader", "a/x", true, true, "a-readers"},
		{"reader", "a", false, true, "a-readers"}, // also ab..., of which only ab is readable
		{"reader", "", false, true, "a-readers"},
		{"reader", "ab/", true, true, "ab-readers"},
		{"reader", "b", false, false, RuleDefaultDeny},
		{"reader", "a/x/", true, true, "a-readers"},
		{"locker", "a/", false, false, RuleDefaultDeny},
		{"root", "", true, true, "star"},
		{"someone", "", false, true, "everyone-reads-pub"},
		{"someone", "pub", false, true, "everyone-reads-pub"},
		{"someone", "pub/", true, true, "everyone-reads-pub"},
		{"someone", "pubx", false, false, RuleDefaultDeny},
	} {
		all, some, rule := p.Scope(c.principal, ActionRead, c.prefix)
		if all != c.all || some != c.some || rule != c.rule {
			t.Errorf("Scope(%q, read, %q) = %v, %v, %q; want %v, %v, %q", c.principal, c.prefix, all, some, rule, c.all, c.some, c.rule)
		}
	}
}

// TestParsePolicyErrors: every malformed file names its line and reason.
func TestParsePolicyErrors(t *testing.T) {
	for _, c := range []struct {
		name, src string
		line      int
		reason    string
	}{
		{"empty", "", 0, "empty"},
		{"syntax", "rules: []\n\nx: 'unterminated\n", 3, "YAML syntax"},
		{"top list", "- a\n", 1, "want a mapping at the top level"},
		{"no rules", "rule: []\n", 1, `unknown key "rule"`},
		{"rules missing", "{}\n", 1, `no "rules" key`},
		{"rules scalar", "rules: x\n", 1, "want a list of rules"},
		{"rule scalar", "rules:\n  - x\n", 2, "rule 1: want a mapping"},
		{"unknown key", "rules:\n  - principals: [a]\n    prefixes: [a]\n    allow: [read]\n    deny: [lock]\n", 5, `unknown key "deny"`},
		{"dup key", "rules:\n  - principals: [a]\n    principals: [b]\n    prefixes: [a]\n    allow: [read]\n", 3, `"principals" set more than once`},
		{"missing allow", "rules:\n  - principals: [a]\n    prefixes: [a]\n", 2, `no "allow"`},
		{"bad action", "rules:\n  - principals: [a]\n    prefixes: [a]\n    allow:\n      - read\n      - wrte\n", 6, `unknown action "wrte"`},
		{"empty list", "rules:\n  - principals: []\n    prefixes: [a]\n    allow: [read]\n", 2, "list is empty"},
		{"number", "rules:\n  - principals: [12]\n    prefixes: [a]\n    allow: [read]\n", 2, "quote it"},
		{"empty prefix", "rules:\n  - principals: [a]\n    prefixes: [\"\"]\n    allow: [read]\n", 3, "empty string"},
		{"NUL prefix", "rules:\n  - principals: [a]\n    prefixes: [\"a\\0b\"]\n    allow: [read]\n", 3, "NUL"},
		{"alias", "x: &p [a]\nrules:\n  - principals: *p\n    prefixes: [a]\n    allow: [read]\n", 1, `unknown key "x"`},
		{"alias value", "rules:\n  - principals: [&p a]\n    prefixes: [*p]\n    allow: [read]\n", 3, "alias"},
		{"dup name", "rules:\n  - name: r\n    principals: [a]\n    prefixes: [a]\n    allow: [read]\n  - name: r\n    principals: [a]\n    prefixes: [a]\n    allow: [read]\n", 6, `"r" already used by the rule at line 2`},
		{"reserved name", "rules:\n  - name: default-deny\n    principals: [a]\n    prefixes: [a]\n    allow: [read]\n", 2, "reserved"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParsePolicy([]byte(c.src))
			pe, ok := errors.AsType[*ParseError](err)
			if !ok {
				t.Fatalf("ParsePolicy = %v; want a *ParseError", err)
			}
			if pe.Line != c.line || !strings.Contains(pe.Reason, c.reason) {
				t.Errorf("ParsePolicy = line %d %q; want line %d containing %q", pe.Line, pe.Reason, c.line, c.reason)
			}
		})
	}
}

func TestParsePolicyNames(t *testing.T) {
	p := mustPolicy(t, "# comment\nrules:\n  - principals: [a]\n    prefixes: [x/, \"*\"]\n    allow: [read, lock]\n")
	r := p.Rules()
	if len(r) != 1 || r[0].Name != "rule 1 (line 3)" || r[0].Line != 3 {
		t.Fatalf("rules = %+v; want one named \"rule 1 (line 3)\"", r)
	}
	if got := strings.Join(r[0].Prefixes, ","); got != "x,*" {
		t.Errorf("prefixes = %s; want x,* (trailing / dropped)", got)
	}
}
