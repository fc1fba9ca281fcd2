package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// Bounds of CheckRemaining.
const (
	// remainingQuiet is how long a session goes without a heartbeat before
	// its grants' Remaining is checked: long enough that a store answering
	// the full TTL is seen.
	remainingQuiet = time.Second
	// remainingVoid voids a measurement that took longer (a loaded
	// machine): by then etcd may have sent the lease's first keepalive on
	// its own (a third of the TTL after the grant, at most 3s), which
	// legitimately renews Remaining. The check is then repeated.
	remainingVoid = 2500 * time.Millisecond
	// remainingSlack absorbs rounding and the database's clock reading.
	remainingSlack = 100 * time.Millisecond
)

// testRemaining: a grant's Remaining counts down from the last extension of
// the session the backend knows of (C2 #ct2-deadline); nothing renews it
// but a heartbeat (or, on etcd, the store's own keepalives). A store that
// answers the full TTL every time fails it.
func (s *suite) testRemaining(t *testing.T) {
	st := s.instances(t, 1)[0]
	if err := CheckRemaining(t, st); err != nil {
		t.Error(err)
	}
}

// CheckRemaining is the conformance subtest RemainingCountsDown as a
// function, so that a backend's tests can run it against a wrapped store as
// a control: it opens a session of LongTTL on st, lets it go remainingQuiet
// without a heartbeat, then asks for two grants (TryInsert, Acquire) and a
// heartbeat. It returns an error when OpenSession or Heartbeat report more
// than the session's TTL, or a grant reports more than TTL minus the time
// since OpenSession returned (every extension a store may have made by then
// happened before that). It fails t only when the backend itself fails.
func CheckRemaining(t *testing.T, st store.LockStore) error {
	t.Helper()
	for attempt := 1; ; attempt++ {
		void, err := checkRemainingOnce(t, st, attempt)
		if !void || attempt == 3 {
			if void {
				t.Fatalf("CheckRemaining: every measurement took longer than %v (machine too slow)", remainingVoid)
			}
			return err
		}
		t.Logf("CheckRemaining: attempt %d took longer than %v; repeating", attempt, remainingVoid)
	}
}

func checkRemainingOnce(t *testing.T, st store.LockStore, attempt int) (void bool, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sess, err := st.OpenSession(ctx, LongTTL)
	if err != nil {
		t.Fatalf("OpenSession(%v): %v", LongTTL, err)
	}
	opened := time.Now()
	defer func() {
		if _, cerr := st.CloseSession(ctx, sess.ID); cerr != nil {
			t.Errorf("CloseSession: %v", cerr)
		}
	}()
	if sess.Remaining > sess.TTL+remainingSlack {
		return false, fmt.Errorf("storetest: OpenSession: Remaining %v exceeds the TTL %v", sess.Remaining, sess.TTL)
	}
	testkit.Eventually(t, 10*time.Second, "the session quiet for a second", func() bool {
		return time.Since(opened) >= remainingQuiet
	})

	// A grant asked for at call may report at most TTL − (call − opened).
	check := func(op string, call time.Time, rem time.Duration) error {
		if bound := sess.TTL - call.Sub(opened) + remainingSlack; rem > bound {
			return fmt.Errorf("storetest: %s %v after OpenSession (no heartbeat since): Remaining %v; want at most TTL %v − %v "+
				"(+%v slack): nothing renewed the session", op, call.Sub(opened).Round(time.Millisecond), rem,
				sess.TTL, call.Sub(opened).Round(time.Millisecond), remainingSlack)
		}
		return nil
	}
	key := fmt.Sprintf("remaining/%d/", attempt)
	call := time.Now()
	g, ok, err := st.TryInsert(ctx, sess.ID, key+"a")
	if err != nil || !ok {
		t.Fatalf("TryInsert(%s): granted %v, %v; want a grant", key+"a", ok, err)
	}
	tryErr := check("TryInsert", call, g.Remaining)
	call = time.Now()
	g, err = st.Acquire(ctx, sess.ID, key+"b")
	if err != nil {
		t.Fatalf("Acquire(%s): %v", key+"b", err)
	}
	acqErr := check("Acquire", call, g.Remaining)
	if time.Since(opened) > remainingVoid {
		return true, nil
	}
	lv, err := st.Heartbeat(ctx, sess.ID)
	if err != nil || !lv.Live {
		t.Fatalf("Heartbeat: live %v, %v; want live", lv.Live, err)
	}
	var hbErr error
	if lv.Remaining > sess.TTL+remainingSlack {
		hbErr = fmt.Errorf("storetest: Heartbeat: Remaining %v exceeds the TTL %v", lv.Remaining, sess.TTL)
	}
	return false, errors.Join(tryErr, acqErr, hbErr)
}
