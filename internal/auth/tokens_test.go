package auth

import (
	"errors"
	"strings"
	"testing"
)

func TestTokens(t *testing.T) {
	ha, hb := HashToken("secret-a"), HashToken("secret-b")
	for name, src := range map[string]string{
		"lines": "# sha256 principal\n\n" + ha + "  alice\nsha256:" + strings.ToUpper(hb) + "\tBob Smith\n",
		"yaml":  "# tokens\ntokens:\n  - sha256: " + ha + "\n    principal: alice\n  - sha256: sha256:" + hb + "\n    principal: Bob Smith\n",
	} {
		t.Run(name, func(t *testing.T) {
			tok, err := ParseTokens([]byte(src))
			if err != nil {
				t.Fatalf("ParseTokens: %v", err)
			}
			for token, want := range map[string]string{"secret-a": "alice", "secret-b": "Bob Smith", "secret-c": "", "": ""} {
				got, ok := tok.Lookup(token)
				if got != want || ok != (want != "") {
					t.Errorf("Lookup(%q) = %q, %v; want %q", token, got, ok, want)
				}
			}
			// The file holds hashes only: the token itself is no token.
			if p, ok := tok.Lookup(ha); ok {
				t.Errorf("Lookup(the hash) = %q; want no match", p)
			}
		})
	}
}

func TestParseTokensErrors(t *testing.T) {
	h := HashToken("x")
	for _, c := range []struct {
		name, src string
		line      int
		reason    string
	}{
		{"short hash", "abc alice\n", 1, "64 hex digits"},
		{"not hex", strings.Repeat("z", 64) + " alice\n", 1, "not hex"},
		{"no principal", "\n" + h + "\n", 2, "no principal"},
		{"anonymous", h + " anonymous\n", 1, "reserved"},
		{"dup", h + " a\n" + h + " b\n", 2, "already listed at line 1"},
		{"yaml missing", "tokens:\n  - sha256: " + h + "\n", 2, `no "principal"`},
		{"yaml extra", "tokens:\n  - sha256: " + h + "\n    principal: a\n    token: x\n", 4, `unknown key "token"`},
		{"yaml not list", "tokens: 3\n", 1, "want a list"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseTokens([]byte(c.src))
			pe, ok := errors.AsType[*ParseError](err)
			if !ok {
				t.Fatalf("ParseTokens = %v; want a *ParseError", err)
			}
			if pe.Line != c.line || !strings.Contains(pe.Reason, c.reason) {
				t.Errorf("ParseTokens = line %d %q; want line %d containing %q", pe.Line, pe.Reason, c.line, c.reason)
			}
		})
	}
}
