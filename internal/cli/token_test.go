package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"lock.dev/lockd/internal/auth"
)

// TestTokenFile runs `lockd serve` with a policy and a tokens file, and
// client commands with --token-file and LOCKD_TOKEN_FILE: with the token
// they get through, without it they are refused; the token shows in no
// output, and there is no flag taking the token itself.
func TestTokenFile(t *testing.T) {
	t.Parallel()
	const token = "cli-token-of-alice-0123456789abcdef"
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	policy := write("policy.yaml", "rules:\n  - name: alice\n    principals: [alice]\n    prefixes: [\"*\"]\n    allow: [read, lock, admin]\n")
	tokens := write("tokens", auth.HashToken(token)+" alice\n")
	tokenFile := write("token", token+"\n")
	srv := start(t, nil, "serve", "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0",
		"--metrics-listen", "off", "--auth-policy-file", policy, "--auth-tokens-file", tokens)
	addr, _, _ := srv.serving(t)

	var outputs []string
	check := func(what string, res result, ok bool) {
		t.Helper()
		outputs = append(outputs, res.stdout, res.stderr)
		if (res.code == 0) != ok {
			t.Errorf("%s: %v\nwant success %v", what, res, ok)
		}
	}
	check("run --token-file", lockd(t, nil, "run", "--server", addr, "--token-file", tokenFile, "tok/job", "--", "true"), true)
	check("inspect with LOCKD_TOKEN_FILE", lockd(t, []string{"LOCKD_SERVER=" + addr, "LOCKD_TOKEN_FILE=" + tokenFile}, "inspect", "tok/job"), true)
	check("ls --token-file", lockd(t, nil, "ls", "--server", addr, "--token-file", tokenFile), true)
	check("inspect without a token", lockd(t, nil, "inspect", "tok/job", "--server", addr, "--timeout", "2s"), false)
	check("run without a token", lockd(t, nil, "run", "--server", addr, "--timeout", "2s", "tok/job", "--", "true"), false)
	check("inspect with a missing token file", lockd(t, nil, "inspect", "tok/job", "--server", addr, "--token-file", filepath.Join(dir, "nope")), false)
	if res := lockd(t, nil, "inspect", "tok/job", "--server", addr, "--token", token); res.code != ExitUsage {
		t.Errorf("--token (no such flag): %v; want exit %d", res, ExitUsage)
	}
	outputs = append(outputs, srv.stderr.String(), srv.stdout.String())
	for _, out := range outputs {
		if strings.Contains(out, token) {
			t.Errorf("the token appears in an output:\n%s", out)
		}
	}
}
