package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"lock.dev/lockd/internal/testing/testkit"
)

// TestServeRefusesAnonymousAdmin: off loopback, TLS without a client CA and
// without a policy makes every caller an anonymous admin; `lockd serve`
// refuses it naming both keys, starts with --insecure-allow-remote and logs
// insecure_listener reason anonymous_admin; a policy granting admin to
// anonymous is logged as auth_policy_unsafe (C5 #ct5-unsafe, issue 23 F5).
func TestServeRefusesAnonymousAdmin(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testkit.NewCA(t, "lockd-ca")
	srvCert, srvKey := ca.Issue(t, testkit.CertOptions{}).Write(t, dir, "server")
	args := []string{"serve", "--listen", "0.0.0.0:0", "--metrics-listen", "off",
		"--tls-cert-file", srvCert, "--tls-key-file", srvKey}
	res := lockd(t, nil, append(args, "--data-dir", filepath.Join(dir, "d1"))...)
	if res.code != ExitError || !strings.Contains(res.stderr, "lock.server.tls.client-ca-file") ||
		!strings.Contains(res.stderr, "lock.auth.policy-file") || !strings.Contains(res.stderr, "insecure-allow-remote") {
		t.Errorf("serve %v: %v\nwant exit %d naming lock.server.tls.client-ca-file, lock.auth.policy-file and the override", args, res, ExitError)
	}

	srv := start(t, nil, append(args, "--data-dir", filepath.Join(dir, "d2"), "--insecure-allow-remote")...)
	srv.serving(t)
	if !strings.Contains(srv.stderr.String(), `"msg":"insecure_listener"`) || !strings.Contains(srv.stderr.String(), `"reason":"anonymous_admin"`) {
		t.Errorf("serve --insecure-allow-remote with anonymous admin did not log insecure_listener reason anonymous_admin:\n%s", srv.stderr)
	}

	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte("rules:\n  - name: open-admin\n    principals: [anonymous]\n    prefixes: [\"*\"]\n    allow: [admin]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv2 := start(t, nil, "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "off",
		"--data-dir", filepath.Join(dir, "d3"), "--auth-policy-file", policy)
	srv2.serving(t)
	if out := srv2.stderr.String(); !strings.Contains(out, `"msg":"auth_policy_unsafe"`) || !strings.Contains(out, `"rule":"open-admin"`) {
		t.Errorf("a policy granting admin to anonymous did not log auth_policy_unsafe naming the rule:\n%s", out)
	}
}
