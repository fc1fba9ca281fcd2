package pgstore

import (
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/pgserver"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// clockStepTTL and clockStepMargin are the session TTL and the client
// safety margin of TestDBClockStepForward (lockd's defaults: 15 s and 2 s).
const (
	clockStepTTL    = 15 * time.Second
	clockStepMargin = 2 * time.Second
)

// TestDBClockStepForward measures C2 #ct2-deadline's requirement that the
// database host's wall clock must not step: PostgreSQL decides expiry by
// comparing expires_at with its own now(). A holder heartbeats as the SDK
// does (trust until send + Remaining − margin); the database host's clock
// then steps forward by twice the TTL (libfaketime under the postmaster).
// Measured: the reaper frees the key at its next run, another session is
// granted it while the holder still trusts its lock, and the holder learns
// only from its next heartbeat answer (not live). The fencing token of the
// new grant is above the old one: a resource that checks tokens refuses
// the old holder's writes. This test pins the limit that C2 and
// docs/backends.md state; if expiry ever stops following the database's
// wall clock it fails, and the documents must change with it.
func TestDBClockStepForward(t *testing.T) {
	srv := pgtest.NewServerWith(t, pgserver.Options{FakeTime: true})
	ctx := testCtx(t)
	if err := srv.CreateDatabase(ctx, "clockstep"); err != nil {
		t.Fatal(err)
	}
	dsn := srv.DSN("clockstep")
	holder, other := newStore(t, dsn), newStore(t, dsn)

	sess, err := holder.OpenSession(ctx, clockStepTTL)
	if err != nil {
		t.Fatal(err)
	}
	g1 := mustTry(t, holder, sess.ID, "step/k")
	// The holder's latest heartbeat: it trusts its lock until deadline.
	sent := time.Now()
	lv, err := holder.Heartbeat(ctx, sess.ID)
	if err != nil || !lv.Live {
		t.Fatalf("Heartbeat = %+v, %v; want live", lv, err)
	}
	deadline := sent.Add(lv.Remaining - clockStepMargin)

	// The database host's clock steps forward by 2 × TTL.
	if err := srv.SetClockOffset(2 * clockStepTTL); err != nil {
		t.Fatal(err)
	}
	stepped := time.Now()
	ws, err := other.OpenSession(ctx, clockStepTTL)
	if err != nil {
		t.Fatal(err)
	}
	var g2 store.Grant
	testkit.Eventually(t, clockStepTTL, "another session granted the key after the step", func() bool {
		var ok bool
		g2, ok, err = other.TryInsert(ctx, ws.ID, "step/k")
		if err != nil {
			t.Fatalf("TryInsert: %v", err)
		}
		return ok
	})
	granted := time.Now()
	if !granted.Before(deadline) {
		t.Fatalf("the key was granted again %v after the holder's deadline; want before it (the limit C2 states)", granted.Sub(deadline))
	}
	// The holder's next heartbeat (the SDK sends one every TTL/3) tells it.
	lv, err = holder.Heartbeat(ctx, sess.ID)
	learned := time.Now()
	if err != nil || lv.Live {
		t.Errorf("holder's Heartbeat after the step = %+v, %v; want not live", lv, err)
	}
	if g2.Token <= g1.Token {
		t.Errorf("new grant's token %d; want above the old holder's %d (fencing)", g2.Token, g1.Token)
	}
	t.Logf("DB clock +%v: key granted again %v after the step, %v before the holder's deadline (TTL %v, margin %v); "+
		"the holder's next heartbeat reported the session gone (%v after the grant here; in the SDK up to TTL/3 = %v)",
		2*clockStepTTL, granted.Sub(stepped).Round(time.Millisecond), deadline.Sub(granted).Round(time.Millisecond),
		clockStepTTL, clockStepMargin, learned.Sub(granted).Round(time.Millisecond), clockStepTTL/3)
}

// TestDBClockStepBackward: a step backwards only delays expiry — the
// database then says the session has its TTL plus the step left (keys stay
// held longer, never freed early).
func TestDBClockStepBackward(t *testing.T) {
	srv := pgtest.NewServerWith(t, pgserver.Options{FakeTime: true})
	ctx := testCtx(t)
	if err := srv.CreateDatabase(ctx, "clockback"); err != nil {
		t.Fatal(err)
	}
	st := newStore(t, srv.DSN("clockback"))
	sess, err := st.OpenSession(ctx, store.MinTTL)
	if err != nil {
		t.Fatal(err)
	}
	mustTry(t, st, sess.ID, "back/k")
	if err := srv.SetClockOffset(-time.Hour); err != nil {
		t.Fatal(err)
	}
	ex, err := st.ExpireSession(ctx, sess.ID)
	if err != nil || ex.Ended || ex.Remaining < time.Hour {
		t.Errorf("ExpireSession after a −1h step = %+v, %v; want not ended, about TTL + 1h left", ex, err)
	}
	if info, held, err := st.Inspect(ctx, "back/k"); err != nil || !held || info.Session != sess.ID {
		t.Errorf("Inspect after a −1h step = %+v, %v, %v; want still held", info, held, err)
	}
}
