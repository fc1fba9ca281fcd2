package auth

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Tokens maps bearer-token hashes to principals (C5 #ct5-auth). A nil
// *Tokens knows no token. Immutable and safe for concurrent use.
type Tokens struct {
	entries []tokenEntry
}

type tokenEntry struct {
	hash      [sha256.Size]byte
	principal string
}

// Len is the number of tokens.
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	return len(t.entries)
}

// Lookup returns the principal of token. It hashes the token and compares
// the hash with every entry in constant time, whichever matches.
func (t *Tokens) Lookup(token string) (principal string, ok bool) {
	if t == nil || token == "" {
		return "", false
	}
	h := sha256.Sum256([]byte(token))
	found := -1
	for i := range t.entries {
		if subtle.ConstantTimeCompare(h[:], t.entries[i].hash[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return "", false
	}
	return t.entries[found].principal, true
}

// HashToken returns the tokens-file form of token: the hex SHA-256.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// ParseTokens parses a tokens file, in the line format or in YAML (a
// top-level "tokens:" key). A malformed file is a *ParseError.
func ParseTokens(data []byte) (*Tokens, error) {
	if len(data) > MaxFileSize {
		return nil, errAt(0, "file is %d bytes, at most %d allowed", len(data), MaxFileSize)
	}
	t := &Tokens{}
	seen := map[[sha256.Size]byte]int{}
	add := func(line int, hashText, principal string) error {
		h, err := parseHash(hashText)
		if err != nil {
			return errAt(line, "%v", err)
		}
		switch {
		case principal == "":
			return errAt(line, "no principal after the hash")
		case principal == Anonymous || principal == Everyone:
			return errAt(line, "principal %q is reserved", principal)
		}
		if prev, dup := seen[h]; dup {
			return errAt(line, "hash already listed at line %d", prev)
		}
		seen[h] = line
		t.entries = append(t.entries, tokenEntry{hash: h, principal: principal})
		return nil
	}
	if isYAMLTokens(data) {
		return t, parseTokensYAML(data, add)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), MaxFileSize)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		hashText, principal := text, ""
		if i := strings.IndexAny(text, " \t"); i >= 0 {
			hashText, principal = text[:i], strings.TrimSpace(text[i+1:])
		}
		if err := add(line, hashText, principal); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, errAt(0, "%v", err)
	}
	return t, nil
}

// isYAMLTokens reports whether the first line that is neither blank nor a
// comment starts the YAML form ("tokens:").
func isYAMLTokens(data []byte) bool {
	for line := range strings.SplitSeq(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		return strings.HasPrefix(line, "tokens:") || line == "---"
	}
	return false
}

func parseTokensYAML(data []byte, add func(line int, hash, principal string) error) error {
	root, err := parseYAML(data)
	if err != nil {
		return err
	}
	top, err := fields(root, "tokens file", "tokens")
	if err != nil {
		return err
	}
	tn, ok := top["tokens"]
	if !ok {
		return errAt(root.Line, "tokens file: no \"tokens\" key")
	}
	if tn.Kind != yaml.SequenceNode {
		return errAt(tn.Line, "tokens: want a list of {sha256, principal}, got %s", kindName(tn))
	}
	for i, n := range tn.Content {
		if n.Kind != yaml.MappingNode {
			return errAt(n.Line, "token %d: want a mapping with sha256 and principal, got %s", i+1, kindName(n))
		}
		f, err := fields(n, "token", "sha256", "principal")
		if err != nil {
			return err
		}
		var vals [2]string
		for j, k := range []string{"sha256", "principal"} {
			v, ok := f[k]
			if !ok {
				return errAt(n.Line, "token %d: no %q", i+1, k)
			}
			if vals[j], err = str(v, "token "+k); err != nil {
				return err
			}
		}
		if err := add(n.Line, vals[0], vals[1]); err != nil {
			return err
		}
	}
	return nil
}

// parseHash parses a hex SHA-256, optionally prefixed "sha256:".
func parseHash(s string) ([sha256.Size]byte, error) {
	var h [sha256.Size]byte
	s = strings.TrimPrefix(s, "sha256:")
	if len(s) != 2*sha256.Size {
		return h, fmt.Errorf("want the hex SHA-256 of the token (%d hex digits), got %d characters", 2*sha256.Size, len(s))
	}
	if _, err := hex.Decode(h[:], []byte(s)); err != nil {
		return h, fmt.Errorf("the hash is not hex: %w", err)
	}
	return h, nil
}
