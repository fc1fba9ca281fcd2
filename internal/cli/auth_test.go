package cli

import (
	"bytes"
	"cmp"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"lock.dev/lockd/internal/auth"
)

// TestAuthCheck: `lockd auth check` prints the decision and the rule that
// made it, exits 0 when allowed and 1 when denied, and refuses a malformed
// policy naming the line; under a policy it prints the principal's seven
// shares as the server computes them (server.PrincipalShares), the server's
// keys read from --config and LOCKD_* as lockd serve reads them.
func TestAuthCheck(t *testing.T) {
	t.Parallel()
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
	// cfgFile sets the server's bounds (and the policy) as lockd serve
	// would read them.
	cfgFile := filepath.Join(dir, "lockd.yaml")
	if err := os.WriteFile(cfgFile, []byte("lock:\n  server:\n    max-sessions: 400\n    principal:\n      max-waiters: 3\n  auth:\n    policy-file: "+limited+"\n"), 0o600); err != nil {
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
			"allowed: alice may lock billing/invoice (rule \"billing\", line 2)\n" + shares("alice", nil), ""},
		{[]string{"alice", "lock", "billingx/invoice", "--policy-file", pf}, nil, 1,
			"denied: alice may not lock billingx/invoice (default-deny: no rule allows it)\n" + shares("alice", nil), ""},
		{[]string{"alice", "admin", "billing/invoice", "--policy-file", pf}, nil, 1,
			"denied: alice may not admin billing/invoice (default-deny: no rule allows it)\n" + shares("alice", nil), ""},
		{[]string{"ops", "admin", "x"}, []string{"LOCKD_AUTH_POLICY_FILE=" + pf}, 0,
			"allowed: ops may admin x (rule \"rule 2 (line 6)\", line 6)\n" + shares("ops", nil), ""},
		{[]string{"alice", "lock", ""}, []string{"LOCKD_AUTH_POLICY_FILE=" + pf}, 0,
			"allowed: alice may lock any key (rule \"billing\", line 2)\n" + shares("alice", nil), ""},
		{[]string{"--prefix", "alice", "read", "", "--policy-file", pf}, nil, 0,
			"allowed: alice may read some keys under \"\" (results filtered to them) (rule \"billing\", line 2)\n" + shares("alice", nil), ""},
		{[]string{"--prefix", "alice", "read", "billing/", "--policy-file", pf}, nil, 0,
			"allowed: alice may read every key under \"billing/\" (rule \"billing\", line 2)\n" + shares("alice", nil), ""},
		{[]string{"--prefix", "alice", "read", "bill/", "--policy-file", pf}, nil, 1,
			"denied: alice may not read any key under \"bill/\" (default-deny: no rule allows it)\n" + shares("alice", nil), ""},
		// admin on no key is ListSessions of every session: admin on jobs/
		// is not enough, as the server decides (issue 23).
		{[]string{"carol", "admin", "", "--policy-file", pf}, nil, 1,
			"denied: carol may not admin every session (ListSessions needs admin on every key) (default-deny: no rule allows it)\n" + shares("carol", nil), ""},
		{[]string{"ops", "admin", "", "--policy-file", pf}, nil, 0,
			"allowed: ops may admin every session (ListSessions needs admin on every key) (rule \"rule 2 (line 6)\", line 6)\n" + shares("ops", nil), ""},
		{[]string{"anonymous", "admin", "x"}, nil, 0,
			"allowed: anonymous may admin x (no-policy: no policy file, every call is allowed)\n", ""},
		{[]string{"alice", "write", "x"}, nil, ExitUsage, "", `unknown action "write"`},
		// The shares (C5 #ct5-principal-limits): all seven, as the server
		// computes them, each with its source.
		{[]string{"mallory", "read", "x", "--policy-file", pf}, nil, 1,
			"denied: mallory may not read x (default-deny: no rule allows it)\n" + shares("mallory", map[string]string{
				"max-connections": "0 (no rule names mallory: it holds no connection)"}), ""},
		{[]string{"alice", "lock", "billing/x", "--policy-file", limited}, nil, 0,
			"allowed: alice may lock billing/x (rule \"billing\", line 2)\n" + shares("alice", map[string]string{
				"max-sessions": "100 (policy limits:, line 7)", "max-connections": "8 (policy limits:, line 9)"}), ""},
		{[]string{"bob", "lock", "billing/x", "--policy-file", limited}, nil, 0,
			"allowed: bob may lock billing/x (rule \"billing\", line 2)\n" + shares("bob", map[string]string{
				"max-sessions": "100 (policy limits:, line 7)"}), ""},
		// The server's keys from the environment and from --config (the
		// policy file too).
		{[]string{"bob", "lock", "billing/x", "--policy-file", limited}, []string{"LOCKD_SERVER_PRINCIPAL_MAX_STREAMS=9", "LOCKD_SERVER_MAX_WATCHES=40"}, 0,
			"allowed: bob may lock billing/x (rule \"billing\", line 2)\n" + shares("bob", map[string]string{
				"max-sessions": "100 (policy limits:, line 7)", "max-streams": "9 (lock.server.principal.max-streams)",
				"max-watches": "10 (25 % of lock.server.max-watches (40))"}), ""},
		{[]string{"carol", "lock", "billing/x", "--config", cfgFile}, nil, 1,
			"denied: carol may not lock billing/x (default-deny: no rule allows it)\n" + shares("carol", map[string]string{
				"max-sessions": "100 (25 % of lock.server.max-sessions (400))", "max-waiters": "3 (lock.server.principal.max-waiters)",
				"max-connections": "0 (no rule names carol: it holds no connection)"}), ""},
		{[]string{"carol", "lock", "billing/x", "--config", cfgFile}, []string{"LOCKD_SERVER_MAX_SESSIONS=800"}, 1,
			"denied: carol may not lock billing/x (default-deny: no rule allows it)\n" + shares("carol", map[string]string{
				"max-sessions": "200 (25 % of lock.server.max-sessions (800))", "max-waiters": "3 (lock.server.principal.max-waiters)",
				"max-connections": "0 (no rule names carol: it holds no connection)"}), ""},
		{[]string{"alice", "lock", "billing/x", "--config", cfgFile}, nil, 0,
			"allowed: alice may lock billing/x (rule \"billing\", line 2)\n" + shares("alice", map[string]string{
				"max-sessions": "100 (policy limits:, line 7)", "max-connections": "8 (policy limits:, line 9)",
				"max-waiters": "3 (lock.server.principal.max-waiters)"}), ""},
		{[]string{"alice", "lock", "x", "--config", filepath.Join(dir, "none.yaml")}, nil, 1, "", "none.yaml"},
		{[]string{"alice", "read", "x", "--policy-file", bad}, nil, 1, "", "policy file " + bad + ": line 4: rule 1 allow: unknown action \"rread\""},
	} {
		res := lockd(t, c.environ, append([]string{"auth", "check"}, c.args...)...)
		if res.code != c.code || res.stdout != c.stdout || !strings.Contains(res.stderr, c.stderr) {
			t.Errorf("lockd auth check %q: %v\nwant exit %d, stdout %q, stderr containing %q", c.args, res, c.code, c.stdout, c.stderr)
		}
	}
}

// shares is what lockd auth check prints of principal's shares under the
// default configuration, with the lines of set replacing the defaults'.
func shares(principal string, set map[string]string) string {
	out := "limits of " + principal + " (per-principal shares):\n"
	for _, d := range []struct{ key, def string }{
		{"max-streams", "512 (25 % of lock.server.max-streams (2048))"},
		{"max-watches", "64 (25 % of lock.server.max-watches (256))"},
		{"max-sessions", "2500 (25 % of lock.server.max-sessions (10000))"},
		{"max-connections", "256 (25 % of lock.server.max-connections (1024))"},
		{"max-waiters", "1024 (25 % of lock.server.max-waiters (4096))"},
		{"max-inflight", "4096 (25 % of lock.server.max-connections × 16 (16384))"},
		{"max-session-opens", "16 (25 % of lock.server.max-session-opens (64))"},
	} {
		out += "  " + d.key + " " + cmp.Or(set[d.key], d.def) + "\n"
	}
	return out
}

func TestAuthHashToken(t *testing.T) {
	t.Parallel()
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
