package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/auth"
)

// TestSessionsClose runs `lockd serve` with a policy and `lockd sessions
// close --principal alice` (C2 #ct2-close-sessions, issue 23 F3): bob (lock
// only) is refused, the admin closes alice's two sessions and bob's stays;
// --principal is required.
func TestSessionsClose(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	policy := write("policy.yaml", `rules:
  - name: ops
    principals: [root]
    prefixes: ["*"]
    allow: [read, lock, admin]
  - name: users
    principals: [alice, bob]
    prefixes: ["*"]
    allow: [read, lock]
`)
	var hashes strings.Builder
	tokenFile := map[string]string{}
	for _, p := range []string{"root", "alice", "bob"} {
		tok := "cli-close-token-of-" + p + "-0123456789abcdef"
		hashes.WriteString(auth.HashToken(tok) + " " + p + "\n")
		tokenFile[p] = write("token-"+p, tok+"\n")
	}
	tokens := write("tokens", hashes.String())
	srv := start(t, nil, "serve", "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0",
		"--metrics-listen", "off", "--auth-policy-file", policy, "--auth-tokens-file", tokens)
	addr, _, _ := srv.serving(t)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	newClient := func(p string) *client.Client {
		c, err := client.New(addr, client.WithBearerTokenFile(tokenFile[p]))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	alice, bob := newClient("alice"), newClient("bob")
	var sessions []*client.Session
	for _, c := range []*client.Client{alice, alice, bob} {
		s, err := c.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, s)
	}
	if _, err := sessions[0].Acquire(ctx, "jobs/a"); err != nil {
		t.Fatal(err)
	}

	if res := lockd(t, nil, "sessions", "close", "--server", addr, "--token-file", tokenFile["root"]); res.code != ExitUsage {
		t.Errorf("sessions close without --principal: %v; want exit %d", res, ExitUsage)
	}
	res := lockd(t, nil, "sessions", "close", "--principal", "alice", "--server", addr, "--token-file", tokenFile["bob"])
	if res.code == 0 || !strings.Contains(res.stderr, "denied") {
		t.Errorf("sessions close as bob: %v; want refused (access denied)", res)
	}
	res = lockd(t, nil, "sessions", "close", "--principal", "alice", "--server", addr, "--token-file", tokenFile["root"])
	if res.code != 0 || res.stdout != "closed 2 sessions of alice, 1 locks released\n" {
		t.Fatalf("sessions close as root: %v; want closed 2, 1 lock", res)
	}
	res = lockd(t, nil, "sessions", "--server", addr, "--token-file", tokenFile["root"])
	if res.code != 0 || strings.Contains(res.stdout, sessions[0].ID()) || strings.Contains(res.stdout, sessions[1].ID()) ||
		!strings.Contains(res.stdout, sessions[2].ID()) {
		t.Errorf("sessions after closing alice's: %v; want only bob's %s", res, sessions[2].ID())
	}
}
