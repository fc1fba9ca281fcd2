package cli

import (
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

func TestDisplayKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ key, want string }{
		{"jobs/nightly", "jobs/nightly"},
		{"a b/ünï", "a b/ünï"},
		{"x\x1b[2J", `"x\x1b[2J"`},
		{"x\r\nheld:      no", `"x\r\nheld:      no"`},
		{"x\u202egnp.exe", `"x\u202egnp.exe"`}, // right-to-left override
		{"tab\there", `"tab\there"`},
		{`quote"`, `"quote\""`},
	} {
		if got := displayKey(tc.key); got != tc.want {
			t.Errorf("displayKey(%q) = %s; want %s", tc.key, got, tc.want)
		}
	}
}

// TestTextOutputEscapesKeys: a key carrying terminal escapes, CR/LF and a
// bidi override reaches inspect, ls, watch and revoke's text output quoted,
// so none of those characters reaches the operator's terminal raw.
func TestTextOutputEscapesKeys(t *testing.T) {
	t.Parallel()
	const evil = "e/\x1b[2J\rheld:      no\n\u202eforged"
	raw := []string{"\x1b", "\r", "\u202e", "held:      no\n"}
	forBackends(t, func(t *testing.T, srv *lockdtest.Server, environ []string) {
		w := start(t, environ, "watch", "e/")
		testkit.Eventually(t, 30*time.Second, "the watch to be established", func() bool {
			return strings.Contains(w.stderr.String(), `watching "e/"`)
		})
		hold(t, srv.Client, evil)
		check := func(what, out string) {
			t.Helper()
			for _, r := range raw {
				if strings.Contains(out, r) {
					t.Errorf("%s printed %q raw:\n%q", what, r, out)
				}
			}
			if !strings.Contains(out, displayKey(evil)) {
				t.Errorf("%s does not show the quoted key %s:\n%q", what, displayKey(evil), out)
			}
		}
		res := lockd(t, environ, "inspect", evil)
		check("inspect", res.stdout)
		res = lockd(t, environ, "ls", "e/")
		check("ls", res.stdout)
		testkit.Eventually(t, 30*time.Second, "watch to print the acquisition", func() bool {
			return strings.Contains(w.stdout.String(), "token=")
		})
		check("watch", w.stdout.String())
		res = lockd(t, environ, "revoke", evil)
		check("revoke", res.stdout)
		if res.code != 0 {
			t.Fatalf("revoke: %v", res)
		}
	})
}
