package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
)

// TestMultiHoldersShown: issue #15 §3–§4 in the CLI. inspect and ls show
// every holder of a semaphore and of a read/write key (text and JSON), with
// its token, mode and owner; a key, owner or value with control characters
// is shown quoted, never raw.
func TestMultiHoldersShown(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, srv *lockdtest.Server, environ []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		const (
			semKey = "multi/s\x1b[2Jem" // an ESC sequence: must not reach the terminal
			rwKey  = "multi/rw"
		)
		type holder struct {
			owner string
			token uint64
		}
		take := func(key, owner string, value []byte, opts ...client.AcquireOption) holder {
			t.Helper()
			s, err := srv.Client.NewSession(ctx, client.WithOwner(owner, nil))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close(context.Background()) })
			l, err := s.Acquire(ctx, key, append(opts, client.WithValue(value))...)
			if err != nil {
				t.Fatalf("Acquire(%q) by %s: %v", key, owner, err)
			}
			return holder{owner, l.Token()}
		}
		sem := []holder{
			take(semKey, "web-1", []byte("line1\nline2"), client.WithLimit(3)),
			take(semKey, "web-2", nil, client.WithLimit(3)),
		}
		rw := []holder{
			take(rwKey, "reader-1", nil, client.Shared()),
			take(rwKey, "reader-2", nil, client.Shared()),
		}

		res := lockd(t, environ, "inspect", semKey)
		wants := []string{`key:       "multi/s\x1b[2Jem"` + "\n", "kind:      semaphore of 3\n", "holders:   2 of 3\n",
			`     value:   "line1\nline2"` + "\n"}
		for i, h := range sem {
			wants = append(wants, fmt.Sprintf("  %d. token %d, session ", i+1, h.token), ", owner "+h.owner+", held for ")
		}
		checkText(t, "inspect sem", res, wants)
		res = lockd(t, environ, "inspect", rwKey)
		wants = []string{"kind:      read/write lock\n", "holders:   2\n"}
		for i, h := range rw {
			wants = append(wants, fmt.Sprintf("  %d. token %d shared, session ", i+1, h.token), ", owner "+h.owner+", held for ")
		}
		checkText(t, "inspect rw", res, wants)

		res = lockd(t, environ, "inspect", "-o", "json", semKey)
		var one lockJSON
		if err := json.Unmarshal([]byte(res.stdout), &one); err != nil || res.code != 0 {
			t.Fatalf("inspect -o json: %v (%v)", res, err)
		}
		if one.Key != semKey || one.Kind != "semaphore" || one.Limit != 3 || len(one.Holders) != 2 ||
			one.Holders[0].Token != sem[0].token || one.Holders[0].Owner != "web-1" || string(one.Holders[0].Value) != "line1\nline2" ||
			one.Holders[1].Token != sem[1].token || one.Holders[1].Owner != "web-2" || one.Holders[1].AcquiredAt == nil ||
			one.Token != sem[0].token {
			t.Errorf("inspect -o json (semaphore) = %+v", one)
		}

		res = lockd(t, environ, "ls", "multi/")
		lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
		checkText(t, "ls", res, nil)
		// Header, two rows of multi/rw (it sorts first), two of the semaphore.
		if len(lines) != 5 {
			t.Fatalf("ls multi/: %d lines, want a header and a row per holder:\n%s", len(lines), res.stdout)
		}
		for i, want := range []struct {
			key  string
			h    holder
			mode string
		}{{rwKey, rw[0], "shared"}, {rwKey, rw[1], "shared"}, {`"multi/s\x1b[2Jem"`, sem[0], "sem/3"}, {`"multi/s\x1b[2Jem"`, sem[1], "sem/3"}} {
			f := strings.Fields(lines[i+1])
			if len(f) != 6 || f[0] != want.key || f[1] != itoa(want.h.token) || f[3] != "0" || f[4] != want.mode || f[5] != want.h.owner {
				t.Errorf("ls row %d = %q; want key %s, token %d, 0 waiters, mode %s, owner %s", i+1, lines[i+1], want.key, want.h.token, want.mode, want.h.owner)
			}
		}
		res = lockd(t, environ, "ls", "-o", "json", "multi/")
		var all []lockJSON
		if err := json.Unmarshal([]byte(res.stdout), &all); err != nil || res.code != 0 {
			t.Fatalf("ls -o json: %v (%v)", res, err)
		}
		if len(all) != 2 || all[0].Kind != "rw" || len(all[0].Holders) != 2 || all[0].Holders[1].Mode != "shared" ||
			all[0].Holders[1].Token != rw[1].token || all[1].Kind != "semaphore" || len(all[1].Holders) != 2 {
			t.Errorf("ls -o json = %+v", all)
		}
		if strings.Contains(res.stdout, "\x1b") {
			t.Errorf("ls -o json wrote a raw ESC: %q", res.stdout)
		}
	})
}

// checkText fails unless res succeeded, its stdout holds every want, and no
// raw control character (other than the line ends) reached it.
func checkText(t *testing.T, what string, res result, wants []string) {
	t.Helper()
	if res.code != 0 {
		t.Fatalf("%s: %v", what, res)
	}
	if strings.ContainsFunc(res.stdout, func(r rune) bool { return r < 0x20 && r != '\n' || r == 0x7f }) {
		t.Errorf("%s wrote a raw control character: %q", what, res.stdout)
	}
	for _, want := range wants {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("%s: %v\nwant %q", what, res, want)
		}
	}
}
