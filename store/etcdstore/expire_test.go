package etcdstore

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// dropStore opens a Store whose etcd client loses the reply of a
// transaction once armed (etcdtest.ReplyDropper), with its logs and
// metrics.
func dropStore(t *testing.T, prefix string) (*Store, *etcdtest.ReplyDropper, *testkit.LogBuffer, *prometheus.Registry) {
	t.Helper()
	cli, drop := etcdtest.NewDropClient(t)
	logger, logs := testkit.NewLogger()
	reg := prometheus.NewRegistry()
	met, err := telemetry.NewMetrics(reg, Backend)
	if err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
	st, err := New(ctxT(t), cli, Options{Prefix: prefix, Logger: logger, Metrics: met})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st, drop, logs, reg
}

// sessionsActive reads lockd_sessions_active.
func sessionsActive(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "lockd_sessions_active" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

// expireLosingReply calls ExpireSession with its transaction's reply
// dropped and returns whether the transaction's success branch ran in etcd.
func expireLosingReply(t *testing.T, st *Store, drop *etcdtest.ReplyDropper, id store.SessionID) bool {
	t.Helper()
	drop.Arm(st.recordKey(id))
	ex, err := st.ExpireSession(ctxT(t), id)
	select {
	case <-drop.Dropped():
	default:
		t.Fatalf("ExpireSession = %+v, %v without its transaction reaching etcd", ex, err)
	}
	if err == nil || errors.Is(err, store.ErrSessionDead) || !store.IsRetryable(err) {
		t.Fatalf("ExpireSession with its reply lost = %+v, %v; want a retryable error (outcome unknown)", ex, err)
	}
	succeeded, _ := drop.Outcome()
	return succeeded
}

// TestExpireSessionReplyLostEnded: ExpireSession's transaction ends the
// session in etcd (no other Store keeps it) and its reply is lost. The
// retry settles the unknown outcome: Ended, one lock released, the lease
// revoked at once; the end is logged once (session_closed, lock_released)
// and the active gauge falls once. Before, the retry was ErrSessionDead
// and nothing recorded the end (C2 ExpireSession).
func TestExpireSessionReplyLostEnded(t *testing.T) {
	prefix := etcdtest.Prefix(t)
	st, drop, logs, reg := dropStore(t, prefix)
	direct := etcdtest.NewClient(t)
	id := openSession(t, st, 30*time.Second) // outlives the test: only a revoke ends it in time
	mustTry(t, st, id, "k")
	lease := leaseOf(t, st, id)

	if !expireLosingReply(t, st, drop, id) {
		t.Fatal("the ExpireSession transaction did not end the session in etcd; the test needs it to")
	}
	if got := sessionsActive(t, reg); got != 1 {
		t.Errorf("lockd_sessions_active = %v while the outcome is unknown; want 1 (still this Store's)", got)
	}
	ex, err := st.ExpireSession(ctxT(t), id)
	if err != nil || !ex.Ended || ex.Released != 1 {
		t.Fatalf("ExpireSession retried after the lost reply = %+v, %v; want Ended, Released 1", ex, err)
	}
	if r, err := direct.TimeToLive(ctxT(t), lease); err != nil || r.TTL >= 0 {
		t.Errorf("the session's lease after the retry: %v, %v; want revoked (TTL -1)", r, err)
	}
	if got := lockKeys(t, direct, prefix); len(got) != 0 {
		t.Errorf("grant keys after the retry: %v; want none", got)
	}
	if _, err := st.ExpireSession(ctxT(t), id); !errors.Is(err, store.ErrSessionDead) {
		t.Errorf("ExpireSession once settled = %v; want ErrSessionDead", err)
	}
	if n := len(logs.Events(telemetry.EventSessionClosed)); n != 1 {
		t.Errorf("session_closed logged %d times; want 1\n%s", n, logs)
	}
	if n := len(logs.Events(telemetry.EventSessionLost)); n != 0 {
		t.Errorf("session_lost logged %d times by the store; want 0 (its caller records client_silent)\n%s", n, logs)
	}
	if n := len(logs.Events(telemetry.EventLockReleased)); n != 1 {
		t.Errorf("lock_released logged %d times; want 1\n%s", n, logs)
	}
	if got := sessionsActive(t, reg); got != 0 {
		t.Errorf("lockd_sessions_active = %v after the end; want 0", got)
	}
}

// TestExpireSessionReplyLostKeptElsewhere: another Store keeps the session,
// so ExpireSession's transaction only withdraws this Store's keeper
// record; its reply is lost. The retry must not end the session: not
// ended, Remaining > 0, and the session stays live through the other Store
// with its lock (a regression guard of the settling path: only a missing
// session record counts as ended).
func TestExpireSessionReplyLostKeptElsewhere(t *testing.T) {
	prefix := etcdtest.Prefix(t)
	st, drop, _, reg := dropStore(t, prefix)
	other := newStore(t, etcdtest.NewClient(t), prefix, nil)
	direct := etcdtest.NewClient(t)
	const ttl = 2 * time.Second
	id := openSession(t, st, ttl)
	g := mustTry(t, st, id, "k")
	if l, err := other.Heartbeat(ctxT(t), id); err != nil || !l.Live {
		t.Fatalf("Heartbeat through the other Store (adopting it) = %+v, %v; want live", l, err)
	}

	if expireLosingReply(t, st, drop, id) {
		t.Fatal("the ExpireSession transaction ended a session another Store keeps")
	}
	if r, err := direct.Get(ctxT(t), st.keeperKey(id), clientv3.WithCountOnly()); err != nil || r.Count != 0 {
		t.Fatalf("this Store's keeper record after the lost reply: %v, %v; want withdrawn", r, err)
	}
	ex, err := st.ExpireSession(ctxT(t), id)
	if err != nil || ex.Ended || ex.Remaining <= 0 {
		t.Fatalf("ExpireSession retried after the lost reply = %+v, %v; want not ended, Remaining > 0", ex, err)
	}
	if got := sessionsActive(t, reg); got != 0 {
		t.Errorf("lockd_sessions_active = %v once settled; want 0 (no longer this Store's)", got)
	}
	// The other Store keeps it for two TTLs more (an observation window,
	// not a synchronisation: every check in it must hold).
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for began := time.Now(); time.Since(began) < 2*ttl; <-tick.C {
		if l, err := other.Heartbeat(ctxT(t), id); err != nil || !l.Live {
			t.Fatalf("Heartbeat through the other Store after the retry = %+v, %v; want live", l, err)
		}
		info, found, err := other.Inspect(ctxT(t), "k")
		if err != nil || !found || info.Session != id || info.Token != g.Token {
			t.Fatalf("Inspect(k) through the other Store = %+v, %v, %v; want held by %s, token %d", info, found, err, id, g.Token)
		}
	}
}

// TestCloseSessionRevokeReplyLost: CloseSession's lease revoke applies in
// etcd but its reply is lost (UNAVAILABLE). clientv3 retries LeaseRevoke
// (a repeatable call) and the retry finds no lease. The session held 3
// locks, within its keeper's bound when the revoke was sent, so the close
// released them: it reports 3, and no session loss is recorded (issue 21:
// a candidate for TestEtcdSessionLease/6_CloseTwice's "first CloseSession
// = 0, <nil>; want 3, nil").
func TestCloseSessionRevokeReplyLost(t *testing.T) {
	t.Parallel()
	prefix := etcdtest.Prefix(t)
	st, drop, logs, _ := dropStore(t, prefix)
	id := openSession(t, st, 30*time.Second)
	for _, k := range []string{"a", "b", "c"} {
		mustTry(t, st, id, k)
	}
	drop.ArmRevoke(int64(leaseOf(t, st, id)))
	n, err := st.CloseSession(ctxT(t), id)
	select {
	case <-drop.Dropped():
	default:
		t.Fatalf("CloseSession = %d, %v without the revoke's reply lost; the test proves nothing", n, err)
	}
	if err != nil || n != 3 {
		t.Errorf("CloseSession whose revoke applied but lost its reply = %d, %v; want 3, nil", n, err)
	}
	if n, err := st.CloseSession(ctxT(t), id); err != nil || n != 0 {
		t.Errorf("second CloseSession = %d, %v; want 0, nil", n, err)
	}
	if lost := logs.Events(telemetry.EventSessionLost); len(lost) != 0 {
		t.Errorf("a CloseSession logged a session loss: %v", lost)
	}
	if closed := logs.Events(telemetry.EventSessionClosed); len(closed) != 1 {
		t.Errorf("session_closed events %v; want one", closed)
	}
}
