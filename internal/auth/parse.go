package auth

import (
	"fmt"
	"regexp"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// ParseError is a malformed policy or tokens file: the line (1-based; 0
// when the problem has no line, e.g. an empty file) and the reason.
type ParseError struct {
	Line   int
	Reason string
}

func (e *ParseError) Error() string {
	if e.Line == 0 {
		return e.Reason
	}
	return fmt.Sprintf("line %d: %s", e.Line, e.Reason)
}

func errAt(line int, format string, args ...any) error {
	return &ParseError{Line: line, Reason: fmt.Sprintf(format, args...)}
}

// MaxFileSize bounds a policy or tokens file.
const MaxFileSize = 1 << 20

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parseYAML parses one YAML document into its root node: a mapping.
func parseYAML(data []byte) (*yaml.Node, error) {
	if len(data) > MaxFileSize {
		return nil, errAt(0, "file is %d bytes, at most %d allowed", len(data), MaxFileSize)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		msg := err.Error()
		if m := yamlLine.FindStringSubmatch(msg); m != nil {
			line, _ := strconv.Atoi(m[1])
			return nil, errAt(line, "YAML syntax: %s", m[2])
		}
		return nil, errAt(0, "YAML syntax: %s", msg)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil, errAt(0, "the file is empty")
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, errAt(root.Line, "want a mapping at the top level, got %s", kindName(root))
	}
	return root, nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "null"
		}
		return fmt.Sprintf("%s %q", n.ShortTag(), n.Value)
	}
	return "nothing"
}

// fields returns a mapping's values by key, refusing keys not in allowed,
// duplicate keys and non-string keys.
func fields(m *yaml.Node, what string, allowed ...string) (map[string]*yaml.Node, error) {
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			return nil, errAt(k.Line, "%s: want a string key, got %s", what, kindName(k))
		}
		known := false
		for _, a := range allowed {
			known = known || a == k.Value
		}
		if !known {
			return nil, errAt(k.Line, "%s: unknown key %q (want one of %v)", what, k.Value, allowed)
		}
		if _, dup := out[k.Value]; dup {
			return nil, errAt(k.Line, "%s: key %q set more than once", what, k.Value)
		}
		out[k.Value] = v
	}
	return out, nil
}

// str returns a string scalar.
func str(n *yaml.Node, what string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		return "", errAt(n.Line, "%s: want a string, got %s (quote it)", what, kindName(n))
	}
	return n.Value, nil
}

// strList returns a non-empty list of non-empty strings.
func strList(n *yaml.Node, what string) ([]string, []int, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, nil, errAt(n.Line, "%s: want a list of strings, got %s", what, kindName(n))
	}
	if len(n.Content) == 0 {
		return nil, nil, errAt(n.Line, "%s: the list is empty", what)
	}
	out := make([]string, 0, len(n.Content))
	lines := make([]int, 0, len(n.Content))
	for _, e := range n.Content {
		s, err := str(e, what)
		if err != nil {
			return nil, nil, err
		}
		if s == "" {
			return nil, nil, errAt(e.Line, "%s: empty string", what)
		}
		out, lines = append(out, s), append(lines, e.Line)
	}
	return out, lines, nil
}

// ParsePolicy parses a policy file (C5 #ct5-auth). A malformed file is a
// *ParseError naming the line and the reason.
func ParsePolicy(data []byte) (*Policy, error) {
	root, err := parseYAML(data)
	if err != nil {
		return nil, err
	}
	top, err := fields(root, "policy", "rules", "limits")
	if err != nil {
		return nil, err
	}
	rn, ok := top["rules"]
	if !ok {
		return nil, errAt(root.Line, "policy: no \"rules\" key (write rules: [] to deny everything)")
	}
	if rn.Kind != yaml.SequenceNode {
		return nil, errAt(rn.Line, "rules: want a list of rules, got %s", kindName(rn))
	}
	p := &Policy{}
	names := map[string]int{}
	for i, n := range rn.Content {
		r, err := parseRule(i, n)
		if err != nil {
			return nil, err
		}
		if prev, dup := names[r.Name]; dup {
			return nil, errAt(r.Line, "rule name %q already used by the rule at line %d", r.Name, prev)
		}
		names[r.Name] = r.Line
		p.rules = append(p.rules, r)
	}
	if ln, ok := top["limits"]; ok {
		if err := parseLimits(ln, p); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func parseRule(i int, n *yaml.Node) (Rule, error) {
	if n.Kind != yaml.MappingNode {
		return Rule{}, errAt(n.Line, "rule %d: want a mapping with principals, prefixes and allow, got %s", i+1, kindName(n))
	}
	what := fmt.Sprintf("rule %d", i+1)
	f, err := fields(n, what, "name", "principals", "prefixes", "allow")
	if err != nil {
		return Rule{}, err
	}
	r := Rule{Line: n.Line, Name: fmt.Sprintf("rule %d (line %d)", i+1, n.Line)}
	if v, ok := f["name"]; ok {
		if r.Name, err = str(v, what+" name"); err != nil {
			return Rule{}, err
		}
		switch r.Name {
		case "":
			return Rule{}, errAt(v.Line, "%s name: empty string", what)
		case RuleNoPolicy, RuleDefaultDeny:
			return Rule{}, errAt(v.Line, "%s name: %q is reserved", what, r.Name)
		}
	}
	for _, k := range []string{"principals", "prefixes", "allow"} {
		if _, ok := f[k]; !ok {
			return Rule{}, errAt(n.Line, "%s: no %q", what, k)
		}
	}
	if r.Principals, _, err = strList(f["principals"], what+" principals"); err != nil {
		return Rule{}, err
	}
	prefixes, lines, err := strList(f["prefixes"], what+" prefixes")
	if err != nil {
		return Rule{}, err
	}
	for j, p := range prefixes {
		if err := checkPrefix(p); err != nil {
			return Rule{}, errAt(lines[j], "%s prefixes: %v", what, err)
		}
		r.Prefixes = append(r.Prefixes, normPrefix(p))
	}
	actions, lines, err := strList(f["allow"], what+" allow")
	if err != nil {
		return Rule{}, err
	}
	for j, s := range actions {
		a, ok := ParseAction(s)
		if !ok {
			return Rule{}, errAt(lines[j], "%s allow: unknown action %q (want read, lock or admin)", what, s)
		}
		r.Allow = append(r.Allow, a)
	}
	return r, nil
}
