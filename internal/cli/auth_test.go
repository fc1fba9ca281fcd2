package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"lock.dev/lockd/internal/auth"
)

// TestAuthCheck: `lockd auth check` prints the decision and the rule that
// made it, exits 0 when allowed and 1 when denied, and refuses a malformed
// policy naming the line.
func TestAuthCheck(t *testing.T) {
	dir := t.TempDir()
	pf := filepath.Join(dir, "policy.yaml")
	policy := "rules:\n  - name: billing\n    principals: [alice]\n    prefixes: [billing/]\n    allow: [read, lock]\n" +
		"  - principals: [ops]\n    prefixes: [\"*\"]\n    allow: [admin]\n" +
		"  - name: carol-jobs\n    principals: [carol]\n    prefixes: [jobs/]\n    allow: [admin]\n"
	if err := os.WriteFile(pf, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	limited := filepath.Join(dir, "limited.yaml")
	if err := os.WriteFile(limited, []byte("rules:\n  - name: billing\n    principals: [alice, bob]\n    prefixes: [billing/]\n    allow: [lock]\nlimits:\n"+
		"  - rule: billing\n    max-sessions: 100\n  - principals: [alice]\n    max-connections: 8\n    max-sessions: 7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("rules:\n  - principals: [a]\n    prefixes: [a]\n    allow: [rread]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args    []string
		environ []string
		code    int
		stdout  string
		stderr  string
	}{
		{[]string{"alice", "lock", "billing/invoice", "--policy-file", pf}, nil, 0,
			"allowed: alice may lock billing/invoice (rule \"billing\", line 2)\n", ""},
		{[]string{"alice", "lock", "billingx/invoice", "--policy-file", pf}, nil, 1,
			"denied: alice may not lock billingx/invoice (default-deny: no rule allows it)\n", ""},
		{[]string{"alice", "admin", "billing/invoice", "--policy-file", pf}, nil, 1,
			"denied: alice may not admin billing/invoice (default-deny: no rule allows it)\n", ""},
		{[]string{"ops", "admin", "x"}, []string{"LOCKD_AUTH_POLICY_FILE=" + pf}, 0,
			"allowed: ops may admin x (rule \"rule 2 (line 6)\", line 6)\n", ""},
		{[]string{"alice", "lock", ""}, []string{"LOCKD_AUTH_POLICY_FILE=" + pf}, 0,
			"allowed: alice may lock any key (rule \"billing\", line 2)\n", ""},
		{[]string{"--prefix", "alice", "read", "", "--policy-file", pf}, nil, 0,
			"allowed: alice may read some keys under \"\" (results filtered to them) (rule \"billing\", line 2)\n", ""},
		{[]string{"--prefix", "alice", "read", "billing/", "--policy-file", pf}, nil, 0,
			"allowed: alice may read every key under \"billing/\" (rule \"billing\", line 2)\n", ""},
		{[]string{"--prefix", "alice", "read", "bill/", "--policy-file", pf}, nil, 1,
			"denied: alice may not read any key under \"bill/\" (default-deny: no rule allows it)\n", ""},
		// admin on no key is ListSessions of every session: admin on jobs/
		// is not enough, as the server decides (issue 23).
		{[]string{"carol", "admin", "", "--policy-file", pf}, nil, 1,
			"denied: carol may not admin every session (ListSessions needs admin on every key) (default-deny: no rule allows it)\n", ""},
		{[]string{"ops", "admin", "", "--policy-file", pf}, nil, 0,
			"allowed: ops may admin every session (ListSessions needs admin on every key) (rule \"rule 2 (line 6)\", line 6)\n", ""},
		{[]string{"anonymous", "admin", "x"}, nil, 0,
			"allowed: anonymous may admin x (no-policy: no policy file, every call is allowed)\n", ""},
		{[]string{"alice", "write", "x"}, nil, ExitUsage, "", `unknown action "write"`},
		// The shares (C5 #ct5-principal-limits).
		{[]string{"mallory", "read", "x", "--policy-file", pf}, nil, 1,
			"denied: mallory may not read x (default-deny: no rule allows it)\nlimits: no rule names mallory: it holds no connection (max-connections 0)\n", ""},
		{[]string{"alice", "lock", "billing/x", "--policy-file", limited}, nil, 0,
			"allowed: alice may lock billing/x (rule \"billing\", line 2)\nlimits: max-sessions 100 (line 7), max-connections 8 (line 9); the rest are the server's shares (lock.server.principal.*)\n", ""},
		{[]string{"bob", "lock", "billing/x", "--policy-file", limited}, nil, 0,
			"allowed: bob may lock billing/x (rule \"billing\", line 2)\nlimits: max-sessions 100 (line 7); the rest are the server's shares (lock.server.principal.*)\n", ""},
		{[]string{"alice", "read", "x", "--policy-file", bad}, nil, 1, "", "policy file " + bad + ": line 4: rule 1 allow: unknown action \"rread\""},
	} {
		res := lockd(t, c.environ, append([]string{"auth", "check"}, c.args...)...)
		if res.code != c.code || res.stdout != c.stdout || !strings.Contains(res.stderr, c.stderr) {
			t.Errorf("lockd auth check %q: %v\nwant exit %d, stdout %q, stderr containing %q", c.args, res, c.code, c.stdout, c.stderr)
		}
	}
}

func TestAuthHashToken(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"auth", "hash-token", "alice"},
		&env{stdin: strings.NewReader("s3cret\n"), stdout: &out, stderr: &errb, environ: func() []string { return nil }})
	want := auth.HashToken("s3cret") + "  alice\n"
	if code != 0 || out.String() != want {
		t.Fatalf("hash-token: exit %d, stdout %q, stderr %q; want %q", code, out.String(), errb.String(), want)
	}
	tok, err := auth.ParseTokens(out.Bytes())
	if err != nil {
		t.Fatalf("the printed line does not parse as a tokens file: %v", err)
	}
	if p, ok := tok.Lookup("s3cret"); !ok || p != "alice" {
		t.Errorf("Lookup(s3cret) = %q, %v; want alice", p, ok)
	}
}
