package server_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/etcdstore"
)

// TestExpireSessionReplyLost (issue #21 §2, etcd): a silence close whose
// ExpireSession transaction ends the session in etcd but whose reply is
// lost (etcdtest.ReplyDropper). The server retries, and the retry reports
// the session ended (C2 ExpireSession: an unknown outcome is settled by the
// next call), so the loss is recorded exactly once on this replica:
// session_lost client_silent logged once, lockd_sessions_lost_total up by
// one across the server's and the store's registries, the lock released
// once. The store does not keep the lease alive (it ends at etcd's expiry
// at the latest), and another Store on the prefix, standing in for another
// replica, finds the session over and its key free. Before, the retry was
// answered ErrSessionDead ("whoever ended it recorded the loss") and the
// loss was recorded by nobody.
func TestExpireSessionReplyLost(t *testing.T) {
	prefix := etcdtest.Prefix(t)
	cli, drop := etcdtest.NewDropClient(t)
	direct := etcdtest.NewClient(t)

	logs := &lockdtest.Logs{}
	storeReg := prometheus.NewRegistry()
	met, err := telemetry.NewMetrics(storeReg, etcdstore.Backend)
	if err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
	ctx := testCtx(t, 90*time.Second)
	stA, err := etcdstore.New(ctx, cli, etcdstore.Options{Prefix: prefix, Logger: logs.Logger(), Metrics: met})
	if err != nil {
		t.Fatalf("etcdstore.New (A): %v", err)
	}
	t.Cleanup(func() { stA.Close() })
	stB, err := etcdstore.New(ctx, direct, etcdstore.Options{Prefix: prefix})
	if err != nil {
		t.Fatalf("etcdstore.New (B): %v", err)
	}
	t.Cleanup(func() { stB.Close() })
	srv := lockdtest.Start(t, stA, lockdtest.Options{NoClient: true, Logger: logs.Logger()})
	api := dial(t, srv.Addr)

	id := openRaw(t, ctx, api, 0).SessionId
	g, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: id, Key: "k"})
	if err != nil || !g.Granted {
		t.Fatalf("Acquire(k) = %v, %v; want granted", g, err)
	}
	recordKey := prefix + "s/" + id
	rec, err := direct.Get(ctx, recordKey)
	if err != nil || len(rec.Kvs) != 1 {
		t.Fatalf("Get(%q) = %v, %v; want the session record", recordKey, rec, err)
	}
	var record struct {
		Lease int64 `json:"lease"`
	}
	if err := json.Unmarshal(rec.Kvs[0].Value, &record); err != nil || record.Lease == 0 {
		t.Fatalf("session record %q: %v (lease %d)", rec.Kvs[0].Value, err, record.Lease)
	}
	lease := clientv3.LeaseID(record.Lease)

	// The client falls silent. After the Remaining it was granted, the
	// server's silence close calls ExpireSession, whose transaction ends
	// the session in etcd (no other Store keeps it) and loses its reply.
	// The Remaining is at most the TTL; 10 s more covers a loaded 2-core
	// machine.
	drop.Arm(recordKey)
	select {
	case <-drop.Dropped():
	case <-time.After(lockdtest.TTL + 10*time.Second):
		t.Fatal("no ExpireSession transaction reached etcd within TTL + 10s of the client's silence")
	}
	applied, droppedAt := drop.Outcome()
	if !applied {
		t.Fatal("the dropped ExpireSession transaction did not end the session in etcd; the test needs it to")
	}
	if r, err := direct.Get(ctx, recordKey, clientv3.WithCountOnly()); err != nil || r.Count != 0 {
		t.Fatalf("session record after the dropped transaction: %v, %v; want gone", r, err)
	}

	// Reported lost once on this replica: by the server's retry
	// (client_silent) or by the store (lease_expired), never by both, and
	// not zero times. The server retries after closeRetryMin<<1 (400 ms);
	// 10 s covers that retry's round trips on a loaded machine.
	lost := func() (logged, counted int) {
		for _, reason := range []string{telemetry.LostClientSilent, telemetry.LostLeaseExpired, telemetry.LostKeepaliveFailed, telemetry.LostRevoked, telemetry.LostBackendError} {
			logged += len(logs.Find(telemetry.EventSessionLost, map[string]string{"session": id, "reason": reason}))
			for _, reg := range []*prometheus.Registry{srv.Registry, storeReg} {
				counted += int(counter(t, reg, "lockd_sessions_lost_total", map[string]string{"reason": reason}))
			}
		}
		return logged, counted
	}
	testkit.Eventually(t, 10*time.Second, "the session's loss logged and counted after the lost reply", func() error {
		if logged, counted := lost(); logged < 1 || counted < 1 {
			return fmt.Errorf("session_lost logged %d times, lockd_sessions_lost_total %d", logged, counted)
		}
		return nil
	})

	// Not kept alive: the lease ends within its TTL of the drop at the
	// latest (this Store stopped its keepalives before the transaction;
	// etcd checks expiry every 500 ms; 2 s more for a loaded machine).
	testkit.Eventually(t, lockdtest.TTL+2*time.Second, "the session's lease gone after the dropped reply", func() error {
		r, err := direct.TimeToLive(ctx, lease)
		if err != nil {
			return err
		}
		if r.TTL >= 0 {
			return fmt.Errorf("lease alive, TTL %ds, %v after the drop", r.TTL, time.Since(droppedAt).Round(time.Millisecond))
		}
		return nil
	})
	// Another replica finds it over: it cannot adopt the session, and
	// its key is free.
	if l, err := stB.Heartbeat(ctx, store.SessionID(id)); err == nil && l.Live || err != nil && !errors.Is(err, store.ErrSessionDead) {
		t.Errorf("Heartbeat of the session through another Store = %+v, %v; want not live (ErrSessionDead)", l, err)
	}
	other, err := stB.OpenSession(ctx, longTTL)
	if err != nil {
		t.Fatalf("OpenSession on B: %v", err)
	}
	if g2, ok, err := stB.TryInsert(ctx, other.ID, "k"); err != nil || !ok || g2.Token <= g.Token {
		t.Errorf("TryInsert(k) on B after the lease ended = %+v, %v, %v; want granted with a token above %d", g2, ok, err, g.Token)
	}
	if sessions, err := stB.ListSessions(ctx, store.SessionQuery{}); err != nil {
		t.Errorf("ListSessions on B: %v", err)
	} else {
		for _, s := range sessions {
			if s.ID == store.SessionID(id) {
				t.Errorf("ListSessions on B lists the ended session %s", id)
			}
		}
	}

	// Still once, now that the lease is gone too (a store that noticed
	// the expiry would have reported it by now).
	if logged, counted := lost(); logged != 1 || counted != 1 {
		t.Errorf("session_lost for the session logged %d times, lockd_sessions_lost_total %d; want 1 and 1\nlogs: %v", logged, counted, logs.Find(telemetry.EventSessionLost, nil))
	}
	if n := len(logs.Find(telemetry.EventSessionLost, map[string]string{"session": id, "reason": telemetry.LostClientSilent})); n != 1 {
		t.Errorf("session_lost client_silent logged %d times; want 1 (the retry reports the session ended by this replica's silence close)", n)
	}
	if n := len(logs.Find(telemetry.EventLockReleased, map[string]string{"session": id, "key": "k"})); n != 1 {
		t.Errorf("lock_released for k logged %d times; want 1", n)
	}
}
