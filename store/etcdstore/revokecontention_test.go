package etcdstore

import (
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// revokeTries is more than the revoke's attempts before issue 21's fix
// (10): the hooks below change the key before each of them.
const revokeTries = 12

// TestPlainRevokeUnderContention (issue 21): a Revoke of a plain key whose
// grant changes before every transaction of the revoke still ends the grant
// current at its commit, and only that grant (C2 Revoke). a holds the key;
// revokeTries raw waiters (keys of made-up sessions on a lease of the test)
// are queued. Before each revoke transaction the hook hands the key to the
// next raw waiter as a release's hand-over commit does (the grant key put
// for the waiter on its lease, its waiter key deleted, a "released"
// marker), so the grant the revoke read is never the one its transaction
// finds. On the code before the fix the revoke failed: "store: contention:
// etcdstore: revoke "contended/plain": the grant kept changing".
//
// "lock-delay": a's grant has a lock-delay of a minute, and the hook also
// gives each grant it makes a delay record of a minute, as its
// SetGrantPolicy would: the revoke moves the record of the grant it ended
// to a lease of its own delay (C2 #ct2-delay), the record it finds at its
// commit, not the one it read.
func TestPlainRevokeUnderContention(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
	}{{"plain", 0}, {"lock-delay", time.Minute}} {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcdtest.NewClient(t)
			logger, logs := testkit.NewLogger()
			st := newStore(t, cli, etcdtest.Prefix(t), logger)
			const key = "contended/plain"
			a := openSession(t, st, 10*time.Second)
			ga := mustTry(t, st, a, key)
			if tc.delay > 0 {
				if err := st.SetGrantPolicy(ctxT(t), a, key, ga.Token, store.GrantPolicy{LockDelay: tc.delay}); err != nil {
					t.Fatalf("SetGrantPolicy(lock-delay %v): %v", tc.delay, err)
				}
			}
			ahead, lease := rawWaiters(t, cli, revokeTries,
				func(id store.SessionID) string { return st.waiterKey(key, id) },
				func(id store.SessionID) string { return waiterValue(id, true) })

			// last is the grant the hook made last: the one the revoke's
			// commit finds.
			var last store.Grant
			calls := 0
			hook := func(k string) {
				if k != key || calls >= len(ahead) {
					return
				}
				id := store.SessionID(ahead[calls][len(st.waiterKey(key, "")):])
				calls++
				at := time.Now()
				resp, err := cli.Txn(ctxT(t)).Then(
					clientv3.OpPut(st.lockKey(key), grantValue(id, at), clientv3.WithLease(lease)),
					clientv3.OpDelete(st.waiterKey(key, id)),
					clientv3.OpDelete(st.delayKey(key)),
					clientv3.OpPut(st.markerKey(key), markReleased, clientv3.WithLease(lease)),
				).Commit()
				if err != nil {
					t.Errorf("hand-over to %s: %v", id, err)
					return
				}
				last = store.Grant{Key: key, Session: id, Token: st.token(resp.Header.Revision)}
				if tc.delay > 0 {
					if _, err := cli.Put(ctxT(t), st.delayKey(key), delayRecord(last.Token, tc.delay), clientv3.WithLease(lease)); err != nil {
						t.Errorf("delay record of %s's grant: %v", id, err)
					}
				}
			}
			unset := hookAt(t, st, hookRevokeTry, hook)
			g, found, err := st.Revoke(ctxT(t), key)
			unset()
			if err != nil || !found {
				t.Fatalf("Revoke with the grant handed on before each of its transactions (%d hand-overs): %+v, %v, %v; want the grant current at its commit", calls, g, found, err)
			}
			if g.Session != last.Session || g.Token != last.Token {
				t.Fatalf("Revoke = %s token %d; want the grant current at its commit, %s token %d (%d hand-overs)", g.Session, g.Token, last.Session, last.Token, calls)
			}
			if r, err := cli.Get(ctxT(t), st.lockKey(key)); err != nil || len(r.Kvs) != 0 {
				t.Fatalf("grant key after the revoke: %v, %v; want none", r, err)
			}
			if r, err := cli.Get(ctxT(t), st.markerKey(key)); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != markRevoked {
				t.Fatalf("marker after the revoke: %v, %v; want %q", r, err, markRevoked)
			}
			if n := len(logs.Events("lock_revoked")); n != 1 {
				t.Fatalf("%d lock_revoked events; want 1 (the grant ended)", n)
			}
			if tc.delay > 0 {
				checkMovedDelay(t, cli, st, key, last.Token, tc.delay, lease)
			}
		})
	}
}

// TestMaxHoldRevokeUnderContention (issue 21): the maximum hold's revoke of
// one grant (revokeGrant with its revision) still ends it when its delay
// record changes before every transaction of the revoke: the hook sets a
// new lock-delay on the grant each time (the holder's own SetGrantPolicy,
// a second longer each time). On the code before the fix the revoke
// failed: "store: contention: etcdstore: revoke "contended/maxhold": the
// grant kept changing".
func TestMaxHoldRevokeUnderContention(t *testing.T) {
	cli := etcdtest.NewClient(t)
	st := newStore(t, cli, etcdtest.Prefix(t), nil)
	const key = "contended/maxhold"
	a := openSession(t, st, 10*time.Second)
	ga := mustTry(t, st, a, key)
	delay := time.Minute
	if err := st.SetGrantPolicy(ctxT(t), a, key, ga.Token, store.GrantPolicy{LockDelay: delay}); err != nil {
		t.Fatalf("SetGrantPolicy(lock-delay %v): %v", delay, err)
	}
	companion, err := cli.Get(ctxT(t), st.delayKey(key))
	if err != nil || len(companion.Kvs) != 1 {
		t.Fatalf("delay record after SetGrantPolicy: %v, %v; want one", companion, err)
	}
	calls := 0
	hook := func(k string) {
		if k != key || calls >= revokeTries {
			return
		}
		calls++
		delay += time.Second
		if err := st.SetGrantPolicy(ctxT(t), a, key, ga.Token, store.GrantPolicy{LockDelay: delay}); err != nil {
			t.Errorf("SetGrantPolicy(lock-delay %v) before revoke transaction %d: %v", delay, calls, err)
		}
	}
	rev, _ := st.revision(ga.Token)
	unset := hookAt(t, st, hookRevokeTry, hook)
	g, found, err := st.revokeGrant(ctxT(t), key, rev, markMaxHold)
	unset()
	if err != nil || !found || g.Session != a || g.Token != ga.Token {
		t.Fatalf("max-hold revoke with the delay record changed before each of its transactions (%d changes): %+v, %v, %v; want a's grant, token %d", calls, g, found, err, ga.Token)
	}
	if r, err := cli.Get(ctxT(t), st.markerKey(key)); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != markMaxHold {
		t.Fatalf("marker after the revoke: %v, %v; want %q", r, err, markMaxHold)
	}
	checkMovedDelay(t, cli, st, key, ga.Token, delay, clientv3.LeaseID(companion.Kvs[0].Lease))
}

// checkMovedDelay checks that key's delay record is the record of the grant
// token with delay d, moved off the lease old (a companion or the test's)
// to a lease that ends within d.
func checkMovedDelay(t *testing.T, cli *clientv3.Client, st *Store, key string, token uint64, d time.Duration, old clientv3.LeaseID) {
	t.Helper()
	r, err := cli.Get(ctxT(t), st.delayKey(key))
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != delayRecord(token, d) {
		t.Fatalf("delay record after the revoke: %v, %v; want %q", r, err, delayRecord(token, d))
	}
	l := clientv3.LeaseID(r.Kvs[0].Lease)
	if l == clientv3.NoLease || l == old {
		t.Fatalf("delay record after the revoke on lease %x; want a lease of its own (not %x)", l, old)
	}
	ttl, err := cli.TimeToLive(ctxT(t), l)
	if err != nil {
		t.Fatalf("TimeToLive of the delay record's lease %x: %v", l, err)
	}
	if ttl.TTL <= 0 || time.Duration(ttl.TTL)*time.Second > d+time.Second {
		t.Fatalf("delay record's lease %x after the revoke: TTL %d s; want it to end within %v (a lease of the delay, not a companion)", l, ttl.TTL, d)
	}
}

// TestSlotRevokeUnderContention (issue 21): a Revoke of a semaphore whose
// slots change before every transaction of the revoke still ends every
// slot current at its commit, and only those (C2 Revoke, #ct2-multi). a and
// b hold two slots of three, a raw holder (a made-up session on a lease of
// the test) the third; revokeTries raw waiters are queued. Before each
// revoke transaction the hook hands the raw holder's slot to the next raw
// waiter (its slot deleted, the waiter's put and its waiter key deleted),
// so a slot the revoke read is always gone. On the code before the fix
// the revoke failed: "store: contention: etcdstore: revoke
// "contended/sem": the slots kept changing".
func TestSlotRevokeUnderContention(t *testing.T) {
	cli := etcdtest.NewClient(t)
	logger, logs := testkit.NewLogger()
	st := newStore(t, cli, etcdtest.Prefix(t), logger)
	const key = "contended/sem"
	o := store.AcquireOptions{Limit: 3}
	a, b := openSession(t, st, 10*time.Second), openSession(t, st, 10*time.Second)
	var ga store.Grant
	for _, id := range []store.SessionID{a, b} {
		g, ok, err := st.TryInsert(ctxT(t), id, key, store.WithLimit(3))
		if err != nil || !ok {
			t.Fatalf("TryInsert(%s) by %s = %v, %v; want a slot", key, id, ok, err)
		}
		if id == a {
			ga = g
		}
	}
	if err := st.SetValue(ctxT(t), a, key, ga.Token, []byte("a's value")); err != nil {
		t.Fatalf("SetValue of a's slot: %v", err)
	}
	ahead, lease := rawWaiters(t, cli, revokeTries,
		func(id store.SessionID) string { return st.mwaiterKey(key, id) },
		func(id store.SessionID) string { return entryValue(id, o) })
	slot := func(id store.SessionID) string {
		return entryValue(id, o) + " " + strconv.FormatInt(time.Now().UnixNano(), 10)
	}
	holder := store.SessionID("rawholder")
	if _, err := cli.Put(ctxT(t), st.slotKey(key, holder), slot(holder), clientv3.WithLease(lease)); err != nil {
		t.Fatalf("the raw holder's slot: %v", err)
	}
	calls := 0
	hook := func(k string) {
		if k != key || calls >= len(ahead) {
			return
		}
		id := store.SessionID(ahead[calls][len(st.mwaiterKey(key, "")):])
		calls++
		if _, err := cli.Txn(ctxT(t)).Then(
			clientv3.OpDelete(st.slotKey(key, holder)),
			clientv3.OpPut(st.slotKey(key, id), slot(id), clientv3.WithLease(lease)),
			clientv3.OpDelete(st.mwaiterKey(key, id)),
		).Commit(); err != nil {
			t.Errorf("hand-over of %s's slot to %s: %v", holder, id, err)
		}
		holder = id
	}
	unset := hookAt(t, st, hookRevokeTry, hook)
	g, found, err := st.Revoke(ctxT(t), key)
	unset()
	if err != nil || !found || g.Session != a || g.Token != ga.Token {
		t.Fatalf("Revoke with a slot handed on before each of its transactions (%d hand-overs): %+v, %v, %v; want every slot ended and a's (token %d, the lowest) returned", calls, g, found, err, ga.Token)
	}
	if r, err := cli.Get(ctxT(t), st.multiPrefix(key)+"s", clientv3.WithPrefix()); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("slots after the revoke: %v, %v; want none", r, err)
	}
	if r, err := cli.Get(ctxT(t), st.slotValueKey(key, a)); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("a's value after the revoke: %v, %v; want none", r, err)
	}
	if r, err := cli.Get(ctxT(t), st.multiPrefix(key)+"w", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || r.Count != int64(len(ahead)-calls) {
		t.Fatalf("waiters after the revoke: %v, %v; want the %d the hook did not admit", r, err, len(ahead)-calls)
	}
	revoked := map[string]bool{}
	for _, rec := range logs.Events("lock_revoked") {
		revoked[rec["key"].(string)+" "+strconv.FormatFloat(rec["token"].(float64), 'f', -1, 64)] = true
	}
	if len(revoked) != 3 || !revoked[key+" "+strconv.FormatUint(ga.Token, 10)] {
		t.Fatalf("lock_revoked events %v; want 3 (a's, b's and the raw holder's slots), a's token %d among them", revoked, ga.Token)
	}
	for _, id := range []store.SessionID{a, b} {
		held, err := st.LocksOf(ctxT(t), id)
		if err != nil {
			t.Fatalf("LocksOf(%s): %v", id, err)
		}
		for _, h := range held {
			if h.Key == key {
				t.Fatalf("LocksOf(%s) after the revoke still lists %+v", id, h)
			}
		}
	}
}

// TestRevokeEndsOnlyTheGrantAtItsCommit (issue 21, C2 #ct2-revoke): a
// grant that ended between the revoke's read and its transaction is not
// reported, and a grant made after it keeps living. "released": the hook
// releases a's grant (nobody waits): Revoke finds the key free and ends
// nothing. "max-hold of an ended grant": the hook releases a's grant and a
// takes the key again; the maximum hold's revoke of the first grant ends
// nothing, and the second grant stays.
func TestRevokeEndsOnlyTheGrantAtItsCommit(t *testing.T) {
	for _, maxHold := range []bool{false, true} {
		name := "released"
		if maxHold {
			name = "max-hold of an ended grant"
		}
		t.Run(name, func(t *testing.T) {
			cli := etcdtest.NewClient(t)
			logger, logs := testkit.NewLogger()
			st := newStore(t, cli, etcdtest.Prefix(t), logger)
			const key = "revoke/ended"
			a := openSession(t, st, 10*time.Second)
			ga := mustTry(t, st, a, key)
			var again store.Grant
			hookAt(t, st, hookRevokeTry, func(string) {
				if err := st.DeleteIfOwner(ctxT(t), a, key, ga.Token); err != nil {
					t.Errorf("a's release before the revoke's transaction: %v", err)
				}
				if maxHold {
					again = mustTry(t, st, a, key)
				}
			})
			var (
				g     store.Grant
				found bool
				err   error
			)
			if maxHold {
				rev, _ := st.revision(ga.Token)
				g, found, err = st.revokeGrant(ctxT(t), key, rev, markMaxHold)
			} else {
				g, found, err = st.Revoke(ctxT(t), key)
			}
			if err != nil || found {
				t.Fatalf("revoke of a grant released before its transaction: %+v, %v, %v; want nothing ended", g, found, err)
			}
			info, held, err := st.Inspect(ctxT(t), key)
			switch {
			case err != nil:
				t.Fatalf("Inspect after the revoke: %v", err)
			case maxHold && (!held || info.Session != a || info.Token != again.Token):
				t.Fatalf("after the max-hold revoke of token %d: %+v, held %v; want a's later grant (token %d) living", ga.Token, info, held, again.Token)
			case !maxHold && held:
				t.Fatalf("after the revoke: %+v held; want the key free", info)
			}
			if r, err := cli.Get(ctxT(t), st.markerKey(key)); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != markReleased {
				t.Fatalf("marker after the revoke: %v, %v; want the release's %q", r, err, markReleased)
			}
			if n := len(logs.Events("lock_revoked")); n != 0 {
				t.Fatalf("%d lock_revoked events; want none", n)
			}
		})
	}
}
