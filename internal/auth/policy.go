package auth

import (
	"fmt"
	"strings"

	"lock.dev/lockd/store"
)

// Action is what an access rule allows (C5 #ct5-auth).
type Action string

// The actions of a policy. They are independent: admin implies neither read
// nor lock.
const (
	// ActionRead allows Inspect, List and Watch.
	ActionRead Action = "read"
	// ActionLock allows Acquire and Release on a key, and the session
	// calls (OpenSession, KeepAlive, CloseSession) to a principal with lock
	// on any key.
	ActionLock Action = "lock"
	// ActionAdmin allows Revoke.
	ActionAdmin Action = "admin"
)

// ParseAction returns the Action named s.
func ParseAction(s string) (Action, bool) {
	switch a := Action(s); a {
	case ActionRead, ActionLock, ActionAdmin:
		return a, true
	}
	return "", false
}

// Reserved principals and prefixes of a policy.
const (
	// Anonymous is the principal of a caller without a certificate or a
	// bearer token.
	Anonymous = "anonymous"
	// Everyone, as a principal of a rule, names every authenticated
	// principal (not Anonymous); as a prefix, every key.
	Everyone = "*"
)

// Rules reported by a decision that no rule of a policy made.
const (
	// RuleNoPolicy allows everything: no policy file is configured.
	RuleNoPolicy = "no-policy"
	// RuleDefaultDeny denies: a policy is configured and none of its rules
	// allows the call.
	RuleDefaultDeny = "default-deny"
)

// Rule is one rule of a policy: it allows its actions to its principals on
// the keys its prefixes cover.
type Rule struct {
	// Name is the rule's name: the name in the file, or "rule N (line L)".
	Name       string
	Principals []string
	// Prefixes are the normalised prefixes: Everyone, or a prefix without
	// its trailing "/" (see Covers).
	Prefixes []string
	Allow    []Action
	// Line is the rule's line in the file.
	Line int
}

// Policy is a parsed policy file. A nil *Policy is "no policy": it allows
// everything (RuleNoPolicy). A Policy is immutable and safe for concurrent
// use.
type Policy struct {
	rules  []Rule
	limits []LimitEntry // per-principal shares (limits.go)
}

// UnsafeRules returns the names of the rules that grant admin to Anonymous
// (C5 #ct5-unsafe: every caller without credentials may revoke).
func (p *Policy) UnsafeRules() []string {
	var out []string
	for _, r := range p.Rules() {
		if r.allows(ActionAdmin) && r.names(Anonymous) {
			out = append(out, r.Name)
		}
	}
	return out
}

// Rules returns the policy's rules in file order.
func (p *Policy) Rules() []Rule {
	if p == nil {
		return nil
	}
	return append([]Rule(nil), p.rules...)
}

// normPrefix normalises a rule prefix: one trailing "/" is dropped.
func normPrefix(p string) string {
	if p == Everyone {
		return p
	}
	return strings.TrimSuffix(p, "/")
}

// checkPrefix validates a rule prefix as written in the file.
func checkPrefix(p string) error {
	if p == Everyone {
		return nil
	}
	if err := store.ValidateKey(p); err != nil {
		return fmt.Errorf("prefix %q: %w", p, err)
	}
	return nil
}

// covers reports whether the normalised rule prefix rp covers key: rp is
// Everyone, or key is rp or starts with rp + "/" (whole path segments).
func covers(rp, key string) bool {
	if rp == Everyone {
		return true
	}
	return key == rp || strings.HasPrefix(key, rp+"/")
}

// coversAll reports whether rp covers every key that starts with the
// List/Watch prefix lp.
func coversAll(rp, lp string) bool {
	return rp == Everyone || strings.HasPrefix(lp, rp+"/")
}

// overlaps reports whether rp covers at least one key that starts with lp.
func overlaps(rp, lp string) bool {
	return coversAll(rp, lp) || strings.HasPrefix(rp, lp)
}

func (r *Rule) allows(a Action) bool {
	for _, x := range r.Allow {
		if x == a {
			return true
		}
	}
	return false
}

func (r *Rule) names(principal string) bool {
	for _, p := range r.Principals {
		if p == principal || p == Everyone && principal != Anonymous {
			return true
		}
	}
	return false
}

// Covers reports whether the rule covers key; key "" means "any key" (true).
func (r *Rule) Covers(key string) bool {
	if key == "" {
		return true
	}
	for _, rp := range r.Prefixes {
		if covers(rp, key) {
			return true
		}
	}
	return false
}

// Decide says whether principal may do a on key, and the rule that made the
// decision: the first rule in file order that names the principal, covers
// the key and allows the action; RuleDefaultDeny when none does;
// RuleNoPolicy (allowed) for a nil policy. key "" asks whether principal
// may do a on at least one key (the session calls need lock on some key).
func (p *Policy) Decide(principal string, a Action, key string) (allowed bool, rule string) {
	if p == nil {
		return true, RuleNoPolicy
	}
	for i := range p.rules {
		r := &p.rules[i]
		if r.allows(a) && r.names(principal) && r.Covers(key) {
			return true, r.Name
		}
	}
	return false, RuleDefaultDeny
}

// Scope says how much principal may do a on the keys that start with the
// List/Watch prefix: all of them (all), at least one of them (some; the
// results must then be filtered with Decide per key), or none. rule is the
// first rule covering all of them, else the first covering some, else
// RuleDefaultDeny; RuleNoPolicy for a nil policy.
func (p *Policy) Scope(principal string, a Action, prefix string) (all, some bool, rule string) {
	if p == nil {
		return true, true, RuleNoPolicy
	}
	rule = RuleDefaultDeny
	for i := range p.rules {
		r := &p.rules[i]
		if !r.allows(a) || !r.names(principal) {
			continue
		}
		for _, rp := range r.Prefixes {
			switch {
			case coversAll(rp, prefix):
				return true, true, r.Name
			case !some && overlaps(rp, prefix):
				some, rule = true, r.Name
			}
		}
	}
	return false, some, rule
}
