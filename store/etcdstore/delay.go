package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// Lock-delay and maximum hold (C2 #ct2-delay).
//
// A grant with a lock-delay d has a delay record d/<key> = "<token> <d ms>".
// Every grant compare requires that record to be absent (ifFree, the first
// waiter's take in wait), so while it exists the key is not granted: a
// waiter watches it go. Where the record lives decides when it goes:
//
//   - While the grant stands, on a companion lease of the holder's session
//     (one per session and delay), granted with TTL = session TTL + d + the
//     keepalive interval and kept alive by the keeper with the session's
//     lease, on the same stream, right after it. When the session's lease
//     ends without lockd (lockd died, etcd lost it), nobody keeps the
//     companion either, and it ends at least d after the session's lease:
//     etcd frees the grant, and the record keeps the key for the delay,
//     with no write needed at the end. (On a leader change etcd renews
//     both leases to their full TTL; the companion still ends later.)
//   - When lockd itself ends the session involuntarily (ExpireSession,
//     keepalive failure), it stops keeping the companion, which ends at
//     most TTL + d + interval + 1 s later: never shorter than d.
//   - Revoke and maximum hold move the record, in the transaction that
//     deletes the grant, to a fresh lease of d (rounded up to seconds).
//   - A release deletes it in the release transaction; CloseSession
//     revokes the companions after the session's lease (a lockd that dies
//     between the two leaves the key delayed until they run out).
//
// The record is written by SetGrantPolicy after the grant and before the
// server answers: a grant whose holder learnt of it has its record.
//
// Companion leases are recorded on the session's lease (companionPrefix):
// a Store adopting the session keeps them alive too (record.go, adopt).
//
// Maximum hold: a timer of the Store that set the policy revokes the grant,
// iff it is still the same grant, with a "max_hold" release marker. It
// lives only there (C2 #ct2-delay, the limits with several replicas).

// parseCompanions reads session id's companion records; malformed ones are
// skipped (their delays then run out by themselves, never early: see the
// companion TTL).
func (s *Store) parseCompanions(id store.SessionID, kvs []*mvccpb.KeyValue) map[time.Duration]clientv3.LeaseID {
	var out map[time.Duration]clientv3.LeaseID
	for _, kv := range kvs {
		ms, err1 := strconv.ParseInt(strings.TrimPrefix(string(kv.Key), s.companionPrefix(id)), 10, 64)
		lease, err2 := strconv.ParseInt(string(kv.Value), 10, 64)
		if err1 != nil || err2 != nil || ms <= 0 || lease == 0 {
			continue
		}
		if out == nil {
			out = make(map[time.Duration]clientv3.LeaseID)
		}
		out[time.Duration(ms)*time.Millisecond] = clientv3.LeaseID(lease)
	}
	return out
}

// companionsOf reads session id's companion leases from etcd (a session
// closed through a Store that did not open it).
func (s *Store) companionsOf(ctx context.Context, id store.SessionID) ([]clientv3.LeaseID, error) {
	resp, err := s.cli.Get(ctx, s.companionPrefix(id), clientv3.WithPrefix())
	if err != nil {
		return nil, classify(ctx, err)
	}
	var ids []clientv3.LeaseID
	for _, l := range s.parseCompanions(id, resp.Kvs) {
		ids = append(ids, l)
	}
	return ids, nil
}

// delayRecord is the value of a delay record.
func delayRecord(token uint64, d time.Duration) string {
	return strconv.FormatUint(token, 10) + " " + strconv.FormatInt(d.Milliseconds(), 10)
}

// parseDelay decodes a delay record.
func parseDelay(v []byte) (token uint64, d time.Duration, ok bool) {
	t, ms, ok := strings.Cut(string(v), " ")
	tok, err1 := strconv.ParseUint(t, 10, 64)
	n, err2 := strconv.ParseInt(ms, 10, 64)
	if !ok || err1 != nil || err2 != nil || n < 0 {
		return 0, 0, false
	}
	return tok, time.Duration(n) * time.Millisecond, true
}

// leaseSeconds is d as a lease TTL: whole seconds, rounded up, at least 1.
func leaseSeconds(d time.Duration) int64 { return max(int64((d+time.Second-1)/time.Second), 1) }

// companions are the companion leases of the sessions of a Store, by
// session and delay; guarded by the keeper's lock (the keeper sends their
// keepalives), created one at a time (mu).
type companions struct {
	mu sync.Mutex // serialises creation
}

// companion returns ss's companion lease for delay d, granting it first.
func (s *Store) companion(ctx context.Context, ss *session, d time.Duration) (clientv3.LeaseID, error) {
	s.comp.mu.Lock()
	defer s.comp.mu.Unlock()
	if id, ok := s.keep.companion(ss, d); ok {
		return id, nil
	}
	resp, err := s.cli.Grant(ctx, leaseSeconds(ss.ttl+d+keepaliveInterval(ss.ttl)))
	if err == nil && resp.Error != "" {
		err = errors.New(resp.Error)
	}
	if err != nil {
		return clientv3.NoLease, err
	}
	if !s.keep.addCompanion(ss, d, resp.ID) {
		s.revokeNow(resp.ID)
		return clientv3.NoLease, deadErr(ss)
	}
	return resp.ID, nil
}

// companion returns ss's companion lease for d, if it has one.
func (k *keeper) companion(ss *session, d time.Duration) (clientv3.LeaseID, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	id, ok := ss.companions[d]
	return id, ok
}

// addCompanion records a companion lease of ss, kept alive with its lease
// from now on; false when ss is no longer kept (dead).
func (k *keeper) addCompanion(ss *session, d time.Duration, id clientv3.LeaseID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.leases[ss.lease] != ss {
		return false
	}
	if ss.companions == nil {
		ss.companions = make(map[time.Duration]clientv3.LeaseID)
	}
	ss.companions[d] = id
	return true
}

// dropCompanion forgets a companion lease that etcd no longer has.
func (k *keeper) dropCompanion(ss *session, d time.Duration, id clientv3.LeaseID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ss.companions[d] == id {
		delete(ss.companions, d)
	}
}

// takeCompanions forgets and returns every companion lease of ss.
func (k *keeper) takeCompanions(ss *session) []clientv3.LeaseID {
	k.mu.Lock()
	defer k.mu.Unlock()
	var ids []clientv3.LeaseID
	for _, id := range ss.companions {
		ids = append(ids, id)
	}
	ss.companions = nil
	return ids
}

// SetGrantPolicy implements store.GrantPolicySetter.
func (s *Store) SetGrantPolicy(ctx context.Context, id store.SessionID, key string, token uint64, p store.GrantPolicy) (err error) {
	start := time.Now()
	if err := store.ValidateKey(key); err != nil {
		return fmt.Errorf("etcdstore: set grant policy: %w", err)
	}
	if err := store.ValidateGrantPolicy(p); err != nil {
		return fmt.Errorf("etcdstore: set grant policy: %w", err)
	}
	notOwner := fmt.Errorf("%w: etcdstore: set grant policy %q: token %d is not the current grant of session %s", store.ErrNotOwner, key, token, id)
	ss, err := s.live(ctx, id)
	rev, issued := s.revision(token)
	if errors.Is(err, store.ErrSessionDead) || (err == nil && !issued) {
		return notOwner
	}
	if err != nil {
		return fmt.Errorf("etcdstore: set grant policy: %w", err)
	}
	lk := s.lockKey(key)
	mine := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(lk), "=", rev),
		clientv3.Compare(clientv3.LeaseValue(lk), "=", ss.lease),
	}
	for range 3 {
		then := []clientv3.Op{clientv3.OpDelete(s.delayKey(key))}
		var cl clientv3.LeaseID
		if p.LockDelay > 0 {
			if cl, err = s.companion(ctx, ss, p.LockDelay); err != nil {
				return fmt.Errorf("etcdstore: set grant policy: %w", s.sessionErr(ctx, ss, err))
			}
			then = []clientv3.Op{
				clientv3.OpPut(s.delayKey(key), delayRecord(token, p.LockDelay), clientv3.WithLease(cl)),
				// So that a Store adopting the session keeps cl alive too.
				clientv3.OpPut(s.companionKey(id, p.LockDelay), strconv.FormatInt(int64(cl), 10), clientv3.WithLease(ss.lease)),
			}
		}
		resp, err := s.cli.Txn(ctx).If(mine...).Then(then...).Commit()
		if err != nil && cl != clientv3.NoLease && errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseNotFound) {
			s.keep.dropCompanion(ss, p.LockDelay, cl) // revoked out of band: a new one
			continue
		}
		if err != nil {
			return fmt.Errorf("etcdstore: set grant policy: %w", s.sessionErr(ctx, ss, err))
		}
		if !resp.Succeeded {
			return notOwner
		}
		if p.MaxHold > 0 {
			s.holdUntil(ss, key, rev, start.Add(p.MaxHold))
		}
		return nil
	}
	return fmt.Errorf("%w: etcdstore: set grant policy %q: its companion lease kept vanishing", store.ErrContention, key)
}

// holdUntil arms the maximum-hold timer of the grant (key, rev) of ss.
func (s *Store) holdUntil(ss *session, key string, rev int64, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss.dead || s.closed {
		return
	}
	if t := ss.holds[key]; t != nil {
		t.Stop()
	}
	if ss.holds == nil {
		ss.holds = make(map[string]*time.Timer)
	}
	// The callback runs on its own goroutine; it registers with s.wg
	// under s.mu unless the Store is closed (Close waits for it), and
	// gives up when the session or the Store ends.
	ss.holds[key] = time.AfterFunc(time.Until(at), func() {
		s.mu.Lock()
		if s.closed || ss.dead {
			s.mu.Unlock()
			return
		}
		s.wg.Add(1)
		s.mu.Unlock()
		defer s.wg.Done()
		s.maxHoldRevoke(ss, key, rev)
	})
}

// stopHoldLocked stops the maximum-hold timer of ss's grant of key, or of
// every grant with key "" (s.mu held).
func stopHoldLocked(ss *session, key string) {
	for k, t := range ss.holds {
		if key == "" || k == key {
			t.Stop()
			delete(ss.holds, k)
		}
	}
}

// maxHoldRevoke revokes the grant (key, rev) of ss for its maximum hold,
// retrying while etcd is unreachable, until it is done, the grant is gone,
// or the session or the Store ends.
func (s *Store) maxHoldRevoke(ss *session, key string, rev int64) {
	delay := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		_, _, err := s.revokeGrant(ctx, key, rev, markMaxHold)
		cancel()
		if err == nil {
			return
		}
		s.log.MaxHoldRevokeFailed(ss.id, key, uint64(rev), err)
		t := time.NewTimer(delay)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-ss.done:
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// revokeGrant deletes key's grant — whatever grant the key has when rev is
// 0, else only the grant of that revision — with a release marker of
// reason (markRevoked, markMaxHold), in one transaction compared on the
// grant key alone: that one exists, or has revision rev (C2 #ct2-revoke).
// The grant it ends is the one the transaction deletes (its previous
// value), so a key changing under the revoke (grants, releases handing it
// on, waiters) never makes it retry: nothing but the backend's errors
// fails it (before issue 21 it compared the grant it had read, and gave up
// after 10 changes with "the grant kept changing").
//
// A delay record of the grant it ends moves to a fresh lease of its delay:
// the delay runs from now. A record as read before the transaction is
// moved in it, by a nested transaction compared on the record: while a
// record exists no grant is made (every grant requires it absent; a
// release's hand-over deletes it), so an unchanged record belongs to the
// grant the transaction ends. A record that changed meanwhile (a
// SetGrantPolicy in between) is read back by that nested transaction and
// moved right after (settleDelay): no grant can take the key in between,
// as the record holds it back.
func (s *Store) revokeGrant(ctx context.Context, key string, rev int64, reason string) (store.Grant, bool, error) {
	lk, dk := s.lockKey(key), s.delayKey(key)
	held := clientv3.Compare(clientv3.CreateRevision(lk), "!=", 0)
	if rev != 0 {
		held = clientv3.Compare(clientv3.ModRevision(lk), "=", rev)
	}
	for { // again only when a lease the transaction uses had ended
		gr, err := s.cli.Txn(ctx).Then(clientv3.OpGet(lk), clientv3.OpGet(dk)).Commit()
		if err != nil {
			return store.Grant{}, false, classify(ctx, err)
		}
		kvs := gr.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 || (rev != 0 && kvs[0].ModRevision != rev) {
			return store.Grant{}, false, nil
		}
		// The delay record as read: moved (or, of no grant of this key,
		// deleted) if it is still the same.
		dcmp := clientv3.Compare(clientv3.CreateRevision(dk), "=", 0)
		var dops []clientv3.Op
		var dlease clientv3.LeaseID
		if dkv := gr.Responses[1].GetResponseRange().Kvs; len(dkv) > 0 {
			dcmp = clientv3.Compare(clientv3.ModRevision(dk), "=", dkv[0].ModRevision)
			if tok, d, ok := parseDelay(dkv[0].Value); ok && tok == s.token(kvs[0].ModRevision) && d > 0 {
				lr, err := s.cli.Grant(ctx, leaseSeconds(d))
				if err != nil {
					return store.Grant{}, false, classify(ctx, err)
				}
				dlease = lr.ID
				dops = []clientv3.Op{clientv3.OpPut(dk, string(dkv[0].Value), clientv3.WithLease(dlease))}
			} else {
				dops = []clientv3.Op{clientv3.OpDelete(dk)}
			}
		}
		marker, mlease, err := s.marker(ctx, key, reason)
		if err != nil {
			return store.Grant{}, false, classify(ctx, err)
		}
		s.runHook(hookRevokeTry, key)
		resp, err := s.cli.Txn(ctx).If(held).Then(
			marker,
			clientv3.OpDelete(lk, clientv3.WithPrevKV()),
			clientv3.OpTxn([]clientv3.Cmp{dcmp}, dops, []clientv3.Op{clientv3.OpGet(dk)}),
		).Commit()
		if s.marks.gone(err, mlease) {
			continue // the marker lease ended early: a new one
		}
		if err != nil {
			if dlease != clientv3.NoLease && errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseNotFound) {
				continue // the delay's fresh lease ended early: a new one
			}
			return store.Grant{}, false, classify(ctx, err)
		}
		if !resp.Succeeded {
			return store.Grant{}, false, nil // free by then (or that grant ended)
		}
		prev := resp.Responses[1].GetResponseDeleteRange().GetPrevKvs()
		if len(prev) == 0 {
			return store.Grant{}, false, errors.New("etcdstore: revoke: the delete found no grant its compare found") // cannot happen: etcd applies a transaction at once
		}
		g := store.Grant{Key: key, Token: s.token(prev[0].ModRevision)}
		if holder, at, err := parseGrant(prev[0].Value); err == nil {
			g.Session, g.AcquiredAt = holder, at
		}
		if dt := resp.Responses[2].GetResponseTxn(); !dt.Succeeded {
			// On an error the record stays on its companion lease: the key
			// is held back longer, never shorter, and the grant is ended
			// all the same (C2 #ct2-revoke; C4 has no event for it).
			_ = s.settleDelay(ctx, key, g.Token, dt.Responses[0].GetResponseRange().Kvs)
		}
		release := telemetry.ReleaseRevoked
		if reason == markMaxHold {
			release = telemetry.ReleaseMaxHold
		} else {
			s.log.LockRevoked(ctx, key, g.Token)
		}
		s.mu.Lock()
		if ss := s.sessions[g.Session]; ss != nil && !ss.dead && ss.held[key] == g.Token {
			delete(ss.held, key)
			ss.heldGen++
			delete(ss.queued, key)
			stopHoldLocked(ss, key)
			s.met.Released(release, 1)
			s.log.LockReleased(g, release)
		}
		s.mu.Unlock()
		return g, true, nil
	}
}

// settleDelay moves key's delay record kvs (as a revoke's transaction read
// it after deleting the grant token) to a fresh lease of its delay, or
// deletes it if it is not that grant's. Nothing else changes the record
// meanwhile (no grant is made while it exists, and its grant is gone), so
// the compare on it fails only when its lease ended: nothing left to move.
func (s *Store) settleDelay(ctx context.Context, key string, token uint64, kvs []*mvccpb.KeyValue) error {
	if len(kvs) == 0 {
		return nil
	}
	dk, kv := s.delayKey(key), kvs[0]
	same := clientv3.Compare(clientv3.ModRevision(dk), "=", kv.ModRevision)
	tok, d, ok := parseDelay(kv.Value)
	if !ok || tok != token || d <= 0 {
		_, err := s.cli.Txn(ctx).If(same).Then(clientv3.OpDelete(dk)).Commit()
		return classify(ctx, err)
	}
	for range 3 {
		lr, err := s.cli.Grant(ctx, leaseSeconds(d))
		if err != nil {
			return classify(ctx, err)
		}
		_, err = s.cli.Txn(ctx).If(same).Then(clientv3.OpPut(dk, string(kv.Value), clientv3.WithLease(lr.ID))).Commit()
		if err == nil || !errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseNotFound) {
			return classify(ctx, err)
		}
	}
	return errors.New("its fresh lease kept vanishing")
}

// delayLeft reads, at revision rev, how long the delay record kv still
// keeps its key: its lease's remaining TTL.
func (s *Store) delayLeft(ctx context.Context, kv *mvccpb.KeyValue) (time.Duration, error) {
	if kv.Lease == 0 {
		return 0, nil
	}
	resp, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
	if err != nil {
		return 0, classify(ctx, err)
	}
	if resp.TTL < 0 {
		return 0, nil // gone meanwhile
	}
	return max(time.Duration(resp.TTL)*time.Second, time.Millisecond), nil
}
