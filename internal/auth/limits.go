package auth

import (
	"fmt"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// LimitKey names a per-principal share that a policy file's limits: list
// may set (C5 #ct5-principal-limits): a lock.server.principal.* key without
// its prefix.
type LimitKey string

// The per-principal shares a policy may override.
const (
	LimitSessions     LimitKey = "max-sessions"
	LimitStreams      LimitKey = "max-streams"
	LimitWatches      LimitKey = "max-watches"
	LimitConnections  LimitKey = "max-connections"
	LimitWaiters      LimitKey = "max-waiters"
	LimitInflight     LimitKey = "max-inflight"
	LimitSessionOpens LimitKey = "max-session-opens"
)

// LimitKeys lists every LimitKey, in the order of C5 #ct5-principal-limits.
func LimitKeys() []LimitKey {
	return []LimitKey{LimitStreams, LimitWatches, LimitSessions, LimitConnections, LimitWaiters, LimitInflight, LimitSessionOpens}
}

// MaxLimitValue bounds a share set in a policy file.
const MaxLimitValue = 1_000_000

// LimitEntry is one entry of a policy's limits: list: the principals it
// names (those of a rule when Rule is set) and the shares it sets.
type LimitEntry struct {
	// Principals as in a Rule: names, Everyone, Anonymous.
	Principals []string
	// Rule is the rule whose principals the entry names; "" when the
	// entry lists its principals itself.
	Rule   string
	Values map[LimitKey]int
	// Line is the entry's line in the file.
	Line int
}

func (e *LimitEntry) names(principal string) bool {
	r := Rule{Principals: e.Principals}
	return r.names(principal)
}

// Limits returns the policy's limits: entries in file order.
func (p *Policy) Limits() []LimitEntry {
	if p == nil {
		return nil
	}
	return append([]LimitEntry(nil), p.limits...)
}

// Limit returns the share key of principal that the policy's limits: set
// — the first entry in file order that names the principal and sets the
// key — and that entry's line; ok is false when none does (the server's
// share applies) and for a nil policy.
func (p *Policy) Limit(principal string, key LimitKey) (n, line int, ok bool) {
	if p == nil {
		return 0, 0, false
	}
	for i := range p.limits {
		e := &p.limits[i]
		if v, set := e.Values[key]; set && e.names(principal) {
			return v, e.Line, true
		}
	}
	return 0, 0, false
}

// Names reports whether some rule of the policy names principal (a nil
// policy names everyone). Under a policy, a principal no rule names holds
// no connection slot (C5 #ct5-principal-limits).
func (p *Policy) Names(principal string) bool {
	if p == nil {
		return true
	}
	for i := range p.rules {
		if p.rules[i].names(principal) {
			return true
		}
	}
	return false
}

// parseLimits parses the limits: list of a policy whose rules are parsed.
func parseLimits(n *yaml.Node, p *Policy) error {
	if n.Kind != yaml.SequenceNode {
		return errAt(n.Line, "limits: want a list of entries, got %s", kindName(n))
	}
	rules := map[string]*Rule{}
	for i := range p.rules {
		rules[p.rules[i].Name] = &p.rules[i]
	}
	allowed := []string{"principals", "rule"}
	for _, k := range LimitKeys() {
		allowed = append(allowed, string(k))
	}
	for i, en := range n.Content {
		what := fmt.Sprintf("limits entry %d", i+1)
		if en.Kind != yaml.MappingNode {
			return errAt(en.Line, "%s: want a mapping with principals or rule and max-* keys, got %s", what, kindName(en))
		}
		f, err := fields(en, what, allowed...)
		if err != nil {
			return err
		}
		e := LimitEntry{Line: en.Line, Values: map[LimitKey]int{}}
		pn, hasP := f["principals"]
		rn, hasR := f["rule"]
		switch {
		case hasP == hasR:
			return errAt(en.Line, "%s: want exactly one of principals and rule", what)
		case hasP:
			if e.Principals, _, err = strList(pn, what+" principals"); err != nil {
				return err
			}
		default:
			if e.Rule, err = str(rn, what+" rule"); err != nil {
				return err
			}
			r, ok := rules[e.Rule]
			if !ok {
				return errAt(rn.Line, "%s rule: no rule is named %q", what, e.Rule)
			}
			e.Principals = append([]string(nil), r.Principals...)
		}
		for _, k := range LimitKeys() {
			vn, ok := f[string(k)]
			if !ok {
				continue
			}
			v, err := strconv.Atoi(vn.Value)
			if vn.Kind != yaml.ScalarNode || vn.ShortTag() != "!!int" || err != nil || v < 1 || v > MaxLimitValue {
				return errAt(vn.Line, "%s %s: want an integer 1..%d, got %s", what, k, MaxLimitValue, kindName(vn))
			}
			e.Values[k] = v
		}
		if len(e.Values) == 0 {
			return errAt(en.Line, "%s: sets no limit (want one or more of %v)", what, LimitKeys())
		}
		p.limits = append(p.limits, e)
	}
	return nil
}
