package storetest

import (
	"testing"
	"time"

	"lock.dev/lockd/store"
)

// testFencingAcrossReinit is C2 #ct2-fencing across a re-initialised
// backend, with a fresh namespace standing for a backend initialised afresh
// (etcd: a new prefix, which takes its own epoch; PostgreSQL: a new
// database). The backend tests run FencingAcrossReinit over the other
// re-initialisations (a new etcd data dir, a new schema, another backend).
func (s *suite) testFencingAcrossReinit(t *testing.T) {
	FencingAcrossReinit(t,
		func(t *testing.T) store.LockStore { return s.instances(t, 1)[0] },
		func(t *testing.T) store.LockStore { return openInstance(t, s.cfg.Namespace(t)) })
}

// FencingAcrossReinit checks C2 #ct2-fencing across a re-initialisation:
// before opens a store on a backend initialised now; after, called once
// that store is closed, opens one on a backend initialised afresh, holding
// none of the first one's data. The tokens of each must be above the
// wall-clock time, in microseconds, at which its backend was initialised
// and at most the time at which they were issued; and the second backend's
// token for a key must be above the first one's. Each store is closed
// after its grant.
func FencingAcrossReinit(t *testing.T, before, after func(t *testing.T) store.LockStore) {
	t.Helper()
	const key = "reinit/k"
	grant := func(open func(t *testing.T) store.LockStore, which string) store.Grant {
		t.Helper()
		initAt := time.Now().UnixMicro()
		st := open(t)
		g := mustTry(t, st, openSession(t, st), key)
		issuedBy := time.Now().UnixMicro()
		if g.Token <= uint64(initAt) || g.Token > uint64(issuedBy) {
			t.Fatalf("%s backend: token %d, want above %d (wall-clock µs before the backend was initialised) and at most %d (µs after the grant)",
				which, g.Token, initAt, issuedBy)
		}
		mustRelease(t, st, g)
		if err := st.Close(); err != nil {
			t.Fatalf("%s backend: Close: %v", which, err)
		}
		return g
	}
	g1 := grant(before, "first")
	g2 := grant(after, "re-initialised")
	if g2.Token <= g1.Token {
		t.Fatalf("token of %q on the re-initialised backend = %d, want > %d (the first backend's)", key, g2.Token, g1.Token)
	}
}
