package sessions

import (
	"sync"
	"testing"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// TestEnded: Config.Ended hears of every grant this table answered once,
// when it ends however it ends, with its hold from the first answer on the
// table's clock (an Acquire of the held key keeps it); a seeded grant (not
// answered here) is never told.
func TestEnded(t *testing.T) {
	var mu sync.Mutex
	ended := map[string][]time.Duration{}
	f := newFixture(t, func(c *Config) {
		c.Ended = func(key string, held time.Duration) {
			mu.Lock()
			ended[key] = append(ended[key], held)
			mu.Unlock()
		}
	})
	r := f.open(t, "a")
	grant := func(key string, token uint64) {
		t.Helper()
		if f.Grant(r, f.CloseMark(r), f.clk.Now(), store.Grant{Key: key, Token: token, Remaining: testTTL}, nil) != Granted {
			t.Fatalf("grant %s/%d refused", key, token)
		}
	}
	for _, k := range []string{"released", "revoked", "replaced", "gone1", "gone2"} {
		grant(k, 3)
	}
	f.clk.Add(time.Second)
	grant("released", 3) // the same grant answered again keeps its first answer
	f.clk.Add(time.Second)
	f.Untrack("a", "released", 3)
	f.Untrack("a", "released", 3) // twice: told once
	f.LockLost("a", "revoked", 3, lockdv1.LockLostReason_LOCK_LOST_REASON_REVOKED)
	grant("replaced", 5) // a later grant of the key ends the older one
	f.clk.Add(time.Second)
	f.MarkGone(r)
	want := map[string][]time.Duration{
		"released": {2 * time.Second},
		"revoked":  {2 * time.Second},
		"replaced": {2 * time.Second, time.Second},
		"gone1":    {3 * time.Second},
		"gone2":    {3 * time.Second},
	}
	mu.Lock()
	defer mu.Unlock()
	for k, w := range want {
		if got := ended[k]; len(got) != len(w) || (len(w) > 0 && !equalDurations(got, w)) {
			t.Errorf("Ended(%s) told %v; want %v", k, got, w)
		}
	}
	if len(ended) != len(want) {
		t.Errorf("Ended told of %d keys; want %d: %v", len(ended), len(want), ended)
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
