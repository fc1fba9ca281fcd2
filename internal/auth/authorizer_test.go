package auth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	// Write then rename, as editors and config management do, so the
	// reload loop never reads a half-written file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// events returns the C4 events named event (the log message) in logs.
func events(logs *testkit.LogBuffer, event string) []map[string]any {
	var out []map[string]any
	for _, rec := range logs.Records() {
		if rec["msg"] == event {
			out = append(out, rec)
		}
	}
	return out
}

const (
	policyV1 = "rules:\n  - name: v1\n    principals: [alice]\n    prefixes: [a/]\n    allow: [read]\n"
	policyV2 = "rules:\n  - name: v2\n    principals: [alice]\n    prefixes: [b/]\n    allow: [read]\n"
	policyV3 = "rules:\n  - name: v3\n    principals: [alice]\n    prefixes: [c/]\n    allow: [read]\n"
	badRules = "rules:\n  - name: bad\n    principals: [alice]\n    prefixes: [a/]\n    allow: [raed]\n"
)

// TestNewRefusesMalformed: at start a bad file is an error naming the key,
// the path, the line and the reason.
func TestNewRefusesMalformed(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	writeFile(t, policy, badRules)
	_, err := New(Config{PolicyFile: policy}, Options{})
	if err == nil || !strings.Contains(err.Error(), "lock.auth.policy-file "+policy+": line 5: rule 1 allow: unknown action \"raed\"") {
		t.Fatalf("New with a bad policy = %v; want the key, path, line 5 and the unknown action", err)
	}
	writeFile(t, policy, policyV1)
	tokens := filepath.Join(dir, "tokens")
	writeFile(t, tokens, "nothex alice\n")
	if _, err := New(Config{PolicyFile: policy, TokensFile: tokens}, Options{}); err == nil || !strings.Contains(err.Error(), "lock.auth.tokens-file "+tokens+": line 1:") {
		t.Fatalf("New with bad tokens = %v; want the key, path and line 1", err)
	}
	if _, err := New(Config{TokensFile: tokens}, Options{}); err == nil || !strings.Contains(err.Error(), "needs lock.auth.policy-file") {
		t.Fatalf("New with tokens and no policy = %v; want a refusal", err)
	}
	if _, err := New(Config{PolicyFile: filepath.Join(dir, "missing")}, Options{}); err == nil {
		t.Fatal("New with a missing policy file succeeded")
	}
}

// TestReload: a changed file takes effect by itself; a malformed one is
// refused with its line and reason (auth_reload_failed) and the old policy
// stays in force; Reload re-reads at once.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	writeFile(t, policy, policyV1)
	log, logs := testkit.NewLogger()
	a, err := New(Config{PolicyFile: policy}, Options{Logger: log, ReloadInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer a.Close()
	decides := func(key, rule string) func() bool {
		return func() bool { ok, r := a.Decide("alice", ActionRead, key); return ok && r == rule }
	}
	if ok, r := a.Decide("alice", ActionRead, "a/x"); !ok || r != "v1" {
		t.Fatalf("Decide(alice, read, a/x) = %v, %q; want true, v1", ok, r)
	}

	writeFile(t, policy, policyV2)
	testkit.Eventually(t, 5*time.Second, "the changed policy (v2) in force", decides("b/x", "v2"))

	writeFile(t, policy, badRules)
	testkit.Eventually(t, 5*time.Second, "auth_reload_failed for the bad file", func() bool {
		return len(events(logs, "auth_reload_failed")) > 0
	})
	ev := events(logs, "auth_reload_failed")[0]
	if ev["line"] != float64(5) || !strings.Contains(ev["error"].(string), `unknown action "raed"`) || ev["file"] != policy || ev["kind"] != "policy" {
		t.Errorf("auth_reload_failed = %v; want file, kind policy, line 5 and the reason", ev)
	}
	if ok, r := a.Decide("alice", ActionRead, "b/x"); !ok || r != "v2" {
		t.Errorf("after a bad reload: Decide(alice, read, b/x) = %v, %q; want the old policy (true, v2)", ok, r)
	}
	if err := a.Reload(); err == nil || !strings.Contains(err.Error(), "line 5") {
		t.Errorf("Reload of the bad file = %v; want the line", err)
	}
	if n := len(events(logs, "auth_reload_failed")); n != 2 {
		t.Errorf("auth_reload_failed logged %d times; want once per change plus once for Reload", n)
	}

	// Reload reads a changed file at once, also with polling off (lockd
	// serve calls it on SIGHUP): use a second Authorizer that never polls.
	b, err := New(Config{PolicyFile: policy + ".2"}, Options{})
	if err == nil {
		b.Close()
		t.Fatal("New on a missing file succeeded")
	}
	writeFile(t, policy+".2", policyV1)
	b, err = New(Config{PolicyFile: policy + ".2"}, Options{ReloadInterval: -1})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer b.Close()
	writeFile(t, policy+".2", policyV3)
	if ok, r := b.Decide("alice", ActionRead, "c/x"); ok || r == "v3" {
		t.Fatalf("v3 in force before Reload with polling off: %v, %q", ok, r)
	}
	if err := b.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if ok, r := b.Decide("alice", ActionRead, "c/x"); !ok || r != "v3" {
		t.Errorf("after Reload: Decide(alice, read, c/x) = %v, %q; want true, v3", ok, r)
	}

	// A deleted file keeps the policy in force.
	if err := os.Remove(policy); err != nil {
		t.Fatal(err)
	}
	writeFile(t, policy, policyV3) // back, valid: taken
	testkit.Eventually(t, 5*time.Second, "the fixed policy (v3) in force", decides("c/x", "v3"))
	if ok, _ := a.Decide("alice", ActionRead, "b/x"); ok {
		t.Error("v2's rule still allows b/x after v3 took effect")
	}
}

// TestNoPolicy: without a policy file everything is allowed and tokens are
// refused; a nil Authorizer behaves the same.
func TestNoPolicy(t *testing.T) {
	a, err := New(Config{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var nilA *Authorizer
	for _, az := range []*Authorizer{a, nilA} {
		if ok, r := az.Decide(Anonymous, ActionAdmin, "x"); !ok || r != RuleNoPolicy {
			t.Errorf("Decide = %v, %q; want true, %q", ok, r, RuleNoPolicy)
		}
		if az.Enabled() {
			t.Error("Enabled without a policy")
		}
	}
	if err := nilA.Close(); err != nil {
		t.Error(err)
	}
}
