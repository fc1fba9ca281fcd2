package etcdstore

import (
	"context"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// countedStore is a Store with its logs and metrics: a replica whose
// record of a session's end the tests read (C4 #ct4-replica-count).
type countedStore struct {
	*Store
	logs *testkit.LogBuffer
	reg  *prometheus.Registry
}

func newCountedStore(t *testing.T, prefix string) countedStore {
	t.Helper()
	logger, logs := testkit.NewLogger()
	reg := prometheus.NewRegistry()
	met, err := telemetry.NewMetrics(reg, Backend)
	if err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
	st, err := New(ctxT(t), etcdtest.NewClient(t), Options{Prefix: prefix, Logger: logger, Metrics: met})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return countedStore{Store: st, logs: logs, reg: reg}
}

// endRecord sums, over replicas, what they recorded of session id's end:
// its session_closed and session_lost lines, the keys of its lock_released
// lines (sorted), and lockd_lock_release_total.
func endRecord(t *testing.T, id store.SessionID, replicas ...countedStore) (closed, lost int, released []string, total float64) {
	t.Helper()
	for _, r := range replicas {
		for _, rec := range r.logs.Records() {
			if rec["session"] != string(id) {
				continue
			}
			switch rec["msg"] {
			case telemetry.EventSessionClosed:
				closed++
			case telemetry.EventSessionLost:
				lost++
			case telemetry.EventLockReleased:
				released = append(released, rec["key"].(string))
			}
		}
		mfs, err := r.reg.Gather()
		if err != nil {
			t.Fatalf("Gather: %v", err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "lockd_lock_release_total" {
				for _, m := range mf.GetMetric() {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	sort.Strings(released)
	return closed, lost, released, total
}

// sharedSession opens a session on a with a key granted through a ("a")
// and one through b ("b"), which adopts it: a session two replicas serve,
// with grants made by each. Its TTL outlives the test: only the calls of
// the test end it.
func sharedSession(t *testing.T, a, b countedStore) store.SessionID {
	t.Helper()
	id := openSession(t, a.Store, time.Minute)
	mustTry(t, a.Store, id, "a")
	if l, err := b.Heartbeat(ctxT(t), id); err != nil || !l.Live {
		t.Fatalf("Heartbeat through B (adopting it) = %+v, %v; want live", l, err)
	}
	mustTry(t, b.Store, id, "b")
	return id
}

// TestExpireCountsEveryReplicasGrants (issue 21, C4 #ct4-replica-count):
// the ExpireSession that ends a session records every lock that went with
// it, also the grants another replica made and, when this Store had
// forgotten the session (an earlier ExpireSession found it kept
// elsewhere), all of them. Before the fix it logged and counted only the
// grants in its own cache: "last-keeper" released [b] of [a b];
// "forgotten" released none (server.TestSessionEndCountedOnce/etcd under
// stress: "lockd_lock_release_total 0 ... lock_released lines: A 0, B 0").
func TestExpireCountsEveryReplicasGrants(t *testing.T) {
	t.Run("last-keeper", func(t *testing.T) {
		prefix := etcdtest.Prefix(t)
		a, b := newCountedStore(t, prefix), newCountedStore(t, prefix)
		id := sharedSession(t, a, b)
		// A's client fell silent: B keeps the session, A stops.
		if ex, err := a.ExpireSession(ctxT(t), id); err != nil || ex.Ended {
			t.Fatalf("ExpireSession through A while B keeps it = %+v, %v; want not ended", ex, err)
		}
		// Then B's: nobody keeps it, B ends it.
		if ex, err := b.ExpireSession(ctxT(t), id); err != nil || !ex.Ended || ex.Released != 2 {
			t.Fatalf("ExpireSession through B, the last keeper = %+v, %v; want ended, Released 2", ex, err)
		}
		checkEndRecord(t, id, a, b)
	})
	t.Run("forgotten", func(t *testing.T) {
		prefix := etcdtest.Prefix(t)
		a, b := newCountedStore(t, prefix), newCountedStore(t, prefix)
		id := sharedSession(t, a, b)
		if ex, err := a.ExpireSession(ctxT(t), id); err != nil || ex.Ended {
			t.Fatalf("ExpireSession through A while B keeps it = %+v, %v; want not ended", ex, err)
		}
		// B drops the session as idle (no call used it for a TTL): it
		// stops keeping it and withdraws its keeper record, which does
		// not end it.
		b.mu.Lock()
		ssB := b.sessions[id]
		b.mu.Unlock()
		b.keep.remove(ssB)
		b.dropIdle(ssB)
		testkit.Eventually(t, 10*time.Second, "B's keeper record withdrawn", func() bool {
			r, err := b.cli.Get(ctxT(t), b.keeperKey(id), clientv3.WithCountOnly())
			return err == nil && r.Count == 0
		})
		// A's silence close asks again: A, which no longer knows the
		// session, ends it.
		if ex, err := a.ExpireSession(ctxT(t), id); err != nil || !ex.Ended || ex.Released != 2 {
			t.Fatalf("ExpireSession through A again = %+v, %v; want ended, Released 2", ex, err)
		}
		checkEndRecord(t, id, a, b)
	})
}

// checkEndRecord checks that session id's end, with its two grants a and
// b, is recorded exactly once over the replicas.
func checkEndRecord(t *testing.T, id store.SessionID, replicas ...countedStore) {
	t.Helper()
	closed, lost, released, total := endRecord(t, id, replicas...)
	if closed+lost != 1 || strings.Join(released, " ") != "a b" || total != 2 {
		t.Errorf("the session's end over the replicas: session_closed %d, session_lost %d, lock_released %v, lockd_lock_release_total %v; "+
			"want one end line, lock_released [a b], total 2", closed, lost, released, total)
		for i, r := range replicas {
			t.Logf("replica %d logs:\n%s", i, r.logs)
		}
	}
}

// TestExpireDuringCloseElsewhere (issue 21, C4 #ct4-replica-count): a
// client's close through B (its end claimed, its revoke not yet sent)
// meets B's own silence close (B withdraws its keeper record, A still
// keeps the session) and then A's: A must not end the session under B's
// close, which ends and records it. Before the fix A's ExpireSession ended
// it (no keeper record left) and recorded it, and B's close, finding the
// lease gone under a keeper bound it still trusted, recorded it again with
// nothing released: two session_closed lines (server.TestSessionEndCountedOnce
// /etcd under stress: "session_closed: A 1, B 1").
func TestExpireDuringCloseElsewhere(t *testing.T) {
	prefix := etcdtest.Prefix(t)
	a, b := newCountedStore(t, prefix), newCountedStore(t, prefix)
	id := sharedSession(t, a, b)

	claimed, resume := make(chan struct{}), make(chan struct{})
	afterCloseClaim = func(sid store.SessionID) {
		if sid == id {
			close(claimed)
			<-resume
		}
	}
	t.Cleanup(func() { afterCloseClaim = nil })
	closeDone := make(chan error, 1)
	go func() { // ends when B's CloseSession returns (resume is closed below)
		_, err := b.CloseSession(ctxT(t), id)
		closeDone <- err
	}()
	<-claimed

	// B's silence close, in flight with the client's close: A keeps the
	// session, so B only withdraws its keeper record.
	if ex, err := b.ExpireSession(ctxT(t), id); err != nil || ex.Ended {
		t.Fatalf("ExpireSession through B while A keeps it = %+v, %v; want not ended", ex, err)
	}
	// A's silence close: no keeper record but A's, and B's close under way.
	ex, err := a.ExpireSession(ctxT(t), id)
	close(resume)
	if err != nil || ex.Ended {
		t.Errorf("ExpireSession through A while B's close is under way = %+v, %v; want not ended (B's close ends it)", ex, err)
	}
	if err := <-closeDone; err != nil {
		t.Fatalf("CloseSession through B: %v", err)
	}
	checkEndRecord(t, id, a, b)
	if _, err := a.ExpireSession(ctxT(t), id); err == nil {
		t.Errorf("ExpireSession through A after B's close = nil error; want ErrSessionDead")
	}
}

// TestExpireSettledAfterCloseElsewhere (issue 21, C2 ExpireSession, C4
// #ct4-replica-count): A's ExpireSession loses its reply (its transaction
// only withdrew A's keeper record: B keeps the session); then B's client
// closes the session through B, which ends and records it. A's retry
// settles the unknown outcome: the session record is gone, but B's end
// claim says B ended it, so the retry is ErrSessionDead and A records
// nothing. Before the fix the retry reported it Ended and A logged
// session_closed too (its caller then session_lost client_silent): "the
// session's end over the replicas: session_closed 2".
func TestExpireSettledAfterCloseElsewhere(t *testing.T) {
	prefix := etcdtest.Prefix(t)
	st, drop, logs, reg := dropStore(t, prefix)
	a := countedStore{Store: st, logs: logs, reg: reg}
	b := newCountedStore(t, prefix)
	id := sharedSession(t, a, b)

	if expireLosingReply(t, a.Store, drop, id) {
		t.Fatal("the ExpireSession transaction ended a session another Store keeps")
	}
	if n, err := b.CloseSession(ctxT(t), id); err != nil || n != 2 {
		t.Fatalf("CloseSession through B = %d, %v; want 2, nil", n, err)
	}
	if ex, err := a.ExpireSession(ctxT(t), id); !errors.Is(err, store.ErrSessionDead) {
		t.Errorf("ExpireSession through A retried after B's close = %+v, %v; want ErrSessionDead (B ended and recorded it)", ex, err)
	}
	checkEndRecord(t, id, a, b)
	if got := sessionsActive(t, reg); got != 0 {
		t.Errorf("lockd_sessions_active on A once settled = %v; want 0", got)
	}
	if got := locksHeld(t, reg); got != 0 {
		t.Errorf("lockd_locks_held on A once settled = %v; want 0 (its grant a went with B's close)", got)
	}
}

// locksHeld reads lockd_locks_held.
func locksHeld(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "lockd_locks_held" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

// TestExpireSettledAfterLeaseGone (issue 21, C4 #ct4-replica-count): A's
// ExpireSession ends the session in etcd and loses its reply; the lease is
// gone before the retry (its TTL ran out: revoked out of band here). The
// retry settles it Ended, and this Store, which claimed the end, cannot
// read the session's grants from etcd any more: it records the grants it
// knows of. Before the fix it recorded none, and took them off
// lockd_locks_held all the same: "ExpireSession retried after the lease
// ran out = {Ended:true Released:0}, <nil>; want Ended, Released 2" and
// "lock_released [], lockd_lock_release_total 0".
func TestExpireSettledAfterLeaseGone(t *testing.T) {
	prefix := etcdtest.Prefix(t)
	st, drop, logs, reg := dropStore(t, prefix)
	a := countedStore{Store: st, logs: logs, reg: reg}
	direct := etcdtest.NewClient(t)
	id := openSession(t, st, time.Minute)
	mustTry(t, st, id, "a")
	mustTry(t, st, id, "b")
	lease := leaseOf(t, st, id)

	if !expireLosingReply(t, st, drop, id) {
		t.Fatal("the ExpireSession transaction did not end the session in etcd; the test needs it to")
	}
	if _, err := direct.Revoke(ctxT(t), lease); err != nil {
		t.Fatalf("revoking the session's lease out of band: %v", err)
	}
	if ex, err := st.ExpireSession(ctxT(t), id); err != nil || !ex.Ended || ex.Released != 2 {
		t.Errorf("ExpireSession retried after the lease ran out = %+v, %v; want Ended, Released 2", ex, err)
	}
	checkEndRecord(t, id, a)
	if got := locksHeld(t, reg); got != 0 {
		t.Errorf("lockd_locks_held once settled = %v; want 0", got)
	}
	if got := sessionsActive(t, reg); got != 0 {
		t.Errorf("lockd_sessions_active once settled = %v; want 0", got)
	}
}

// TestExpireAfterOwnClaim (issue 21, C4 #ct4-replica-count): a client's
// close through A claims the session's end and fails before its revoke
// (its context cancelled after the claim); the client then falls silent.
// A's own end marker must not stop A's ExpireSession: it ends the session
// and records the end once. Before the fix the marker blocked it as if
// another Store's close were under way: "ExpireSession through A after its
// own close failed past its claim = {Ended:false Remaining:…}, <nil>;
// want Ended, Released 2" (A then forgot the session, the lease ran out,
// and nobody recorded the end).
func TestExpireAfterOwnClaim(t *testing.T) {
	a := newCountedStore(t, etcdtest.Prefix(t))
	direct := etcdtest.NewClient(t)
	id := openSession(t, a.Store, time.Minute)
	mustTry(t, a.Store, id, "a")
	mustTry(t, a.Store, id, "b")
	lease := leaseOf(t, a.Store, id)

	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	afterCloseClaim = func(sid store.SessionID) {
		if sid == id {
			cancel()
		}
	}
	t.Cleanup(func() { afterCloseClaim = nil })
	if n, err := a.CloseSession(ctx, id); err == nil {
		t.Fatalf("CloseSession with its context cancelled after its claim = %d, nil; want an error", n)
	}
	if r, err := direct.Get(ctxT(t), a.endKey(id)); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("A's end marker after the failed close: %v, %v; want there", r, err)
	}

	if ex, err := a.ExpireSession(ctxT(t), id); err != nil || !ex.Ended || ex.Released != 2 {
		t.Errorf("ExpireSession through A after its own close failed past its claim = %+v, %v; want Ended, Released 2", ex, err)
	}
	if r, err := direct.TimeToLive(ctxT(t), lease); err != nil || r.TTL >= 0 {
		t.Errorf("the session's lease after the ExpireSession: %v, %v; want revoked (TTL -1)", r, err)
	}
	checkEndRecord(t, id, a)
	if got := locksHeld(t, a.reg); got != 0 {
		t.Errorf("lockd_locks_held after the end = %v; want 0", got)
	}
	if got := sessionsActive(t, a.reg); got != 0 {
		t.Errorf("lockd_sessions_active after the end = %v; want 0", got)
	}
}
