package server_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// deadlockPolicy: alice and bob may do everything; carol may read and
// lock the first and last keys of each cycle of TestDeadlockHidesKeys,
// not the middle one.
const deadlockPolicy = `
rules:
  - name: all
    principals: [alice, bob]
    prefixes: ["*"]
    allow: [read, lock]
  - name: carol
    principals: [carol]
    prefixes: ["dlp/g/a", "dlp/g/c", "dlp/h/a", "dlp/h/c"]
    allow: [read, lock]
`

// TestDeadlockHidesKeys: a DEADLOCK refusal names only the cycle's keys
// the refused caller may read (C2 #ct2-deadlock). In the 3-cycle alice
// holds a and waits for b, bob holds b and waits for c, carol holds c and
// closes the cycle waiting for a (the youngest wait: refused). carol may
// not read b: neither the gRPC status (message, ErrorInfo keys) nor the
// HTTP JSON body names it, and the message says one key was withheld.
func TestDeadlockHidesKeys(t *testing.T) {
	az, _ := authFiles(t, deadlockPolicy, "alice", "bob", "carol")
	srv := startHTTP(t, lockdtest.Backends[0], lockdtest.Options{Auth: az})
	ctx := testCtx(t, 60*time.Second)
	api := dial(t, srv.Addr)
	alice, bob, carol := as(ctx, "alice"), as(ctx, "bob"), as(ctx, "carol")
	hc := newJClient(t, "http://"+srv.HTTPAddr, nil)
	hc.token = "token-carol"

	for _, overHTTP := range []bool{false, true} {
		p := "dlp/g/"
		if overHTTP {
			p = "dlp/h/"
		}
		ka, kb, kc := p+"a", p+"b", p+"c"
		sa, sb, sc := openRaw(t, alice, api, longTTL), openRaw(t, bob, api, longTTL), openRaw(t, carol, api, longTTL)
		for _, h := range []struct {
			ctx context.Context
			s   *lockdv1.OpenSessionResponse
			key string
		}{{alice, sa, ka}, {bob, sb, kb}, {carol, sc, kc}} {
			if r, err := api.Acquire(h.ctx, &lockdv1.AcquireRequest{SessionId: h.s.SessionId, SessionSecret: h.s.SessionSecret, Key: h.key}); err != nil || !r.Granted {
				t.Fatalf("Acquire(%s) = %v, %v", h.key, r, err)
			}
		}
		// alice waits for b, then bob for c; both waits end when wctx does.
		wctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for _, w := range []struct {
			from string
			s    *lockdv1.OpenSessionResponse
			key  string
		}{{"alice", sa, kb}, {"bob", sb, kc}} {
			wg.Go(func() {
				_, _ = api.Acquire(as(wctx, w.from), &lockdv1.AcquireRequest{SessionId: w.s.SessionId, SessionSecret: w.s.SessionSecret, Key: w.key, Wait: true})
			})
			waitQueued(t, alice, api, w.from, w.key)
		}

		keys, msg, body := closeCycle(t, carol, api, hc, overHTTP, sc, ka) // carol's token over HTTP
		if !slices.Equal(keys, []string{ka, kc}) {
			t.Errorf("over HTTP %v: keys %v; want [%s %s] (the readable keys only)", overHTTP, keys, ka, kc)
		}
		if strings.Contains(body, kb) || strings.Contains(msg, kb) {
			t.Errorf("over HTTP %v: the refusal names %s, which carol may not read: message %q, body %s", overHTTP, kb, msg, body)
		}
		if !strings.Contains(msg, "and 1 key you may not read") {
			t.Errorf("over HTTP %v: message %q does not say one key was withheld", overHTTP, msg)
		}
		stop()
		wg.Wait()
	}
}
