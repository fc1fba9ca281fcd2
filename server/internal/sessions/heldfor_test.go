package sessions

import (
	"testing"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// TestHeldFor: the hold of a grant this table answered runs from its first
// answer on the table's clock (an Acquire of the held key keeps it); a
// seeded grant, another token, and a grant gone have none.
func TestHeldFor(t *testing.T) {
	f := newFixture(t)
	r := f.open(t, "a")
	grant := func(key string, token uint64) {
		t.Helper()
		if f.Grant(r, f.CloseMark(r), f.clk.Now(), store.Grant{Key: key, Token: token, Remaining: testTTL}, nil) != Granted {
			t.Fatalf("grant %s/%d refused", key, token)
		}
	}
	grant("k", 3)
	f.clk.Add(2 * time.Second)
	grant("k", 3) // the same grant answered again
	f.clk.Add(time.Second)
	if d, ok := f.HeldFor("a", "k", 3); !ok || d != 3*time.Second {
		t.Errorf("HeldFor(k, 3) = %v, %v; want 3s, true", d, ok)
	}
	if _, ok := f.HeldFor("a", "k", 2); ok {
		t.Error("HeldFor answered for another token")
	}
	f.mu.Lock()
	f.trackLocked(r, "seeded", 9) // as Seed tracks a grant read from the store
	f.mu.Unlock()
	if _, ok := f.HeldFor("a", "seeded", 9); ok {
		t.Error("HeldFor answered for a grant this table did not answer")
	}
	grant("k", 4) // a newer grant of the key restarts the hold
	if d, ok := f.HeldFor("a", "k", 4); !ok || d != 0 {
		t.Errorf("HeldFor(k, 4) = %v, %v; want 0, true", d, ok)
	}
	f.LockLost("a", "k", 4, lockdv1.LockLostReason_LOCK_LOST_REASON_REVOKED)
	if _, ok := f.HeldFor("a", "k", 4); ok {
		t.Error("HeldFor answered for a grant gone")
	}
	if _, ok := f.HeldFor("nobody", "k", 4); ok {
		t.Error("HeldFor answered for an unknown session")
	}
}
