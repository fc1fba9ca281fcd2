package etcdstore

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/store"
)

// Sessions shared by every Store on a prefix (C2 #ct2-replicas, the etcd
// rule). A session's record s/<id> lives on its lease: what any Store needs
// to keep the lease alive and to check ownership. Every Store that keeps
// the lease alive has a keeper record s/<id>\x00<instance> on the same
// lease; a Store ends a session whose client fell silent only when no other
// keeper record exists, in the transaction that deletes the session record
// (which makes every later adoption fail). The lease id never leaves this
// package: it is in the record, never in the SPI.

// minExpireRetry is the least Expiry.Remaining of a session that is not
// ended: etcd reports a lease's TTL in whole seconds, and 0 means "under a
// second", so a caller asks again after this.
const minExpireRetry = 100 * time.Millisecond

// sessionRecord is the JSON of s/<id>.
type sessionRecord struct {
	Lease     int64  `json:"lease"`
	TTLms     int64  `json:"ttl_ms"`
	Hash      []byte `json:"h,omitempty"`
	Principal string `json:"p,omitempty"`
	// Epoch is the token shift of the Store that opened the session: an
	// Exclusive Store (embedded etcd) that raised the epoch since does not
	// adopt it (its grants' tokens would read differently).
	Epoch int64 `json:"e"`
}

// newInstanceID names a Store in its keeper records.
func newInstanceID() string { return rand.Text() }

// openOps are the puts of a new session's records, all on its lease: the
// session record, this Store's keeper record and (if any) the holder record.
func (s *Store) openOps(id store.SessionID, lease clientv3.LeaseID, ttl time.Duration, o store.SessionOptions) ([]clientv3.Op, error) {
	rec, err := json.Marshal(sessionRecord{Lease: int64(lease), TTLms: ttl.Milliseconds(), Hash: o.SecretHash, Principal: o.Principal, Epoch: s.shift})
	if err != nil {
		return nil, err
	}
	ops := []clientv3.Op{
		clientv3.OpPut(s.recordKey(id), string(rec), clientv3.WithLease(lease)),
		clientv3.OpPut(s.keeperKey(id), "", clientv3.WithLease(lease)),
	}
	if o.Owner != "" || len(o.Labels) > 0 {
		b, err := json.Marshal(holderRecord{Owner: o.Owner, Labels: o.Labels})
		if err != nil {
			return nil, err
		}
		ops = append(ops, clientv3.OpPut(s.holderKey(id), string(b), clientv3.WithLease(lease)))
	}
	return ops, nil
}

// readRecord reads session id's record: ErrSessionDead when there is none
// (never opened, closed, expired) or when this Store may not adopt it.
func (s *Store) readRecord(ctx context.Context, id store.SessionID) (sessionRecord, int64, error) {
	resp, err := s.cli.Get(ctx, s.recordKey(id))
	if err != nil {
		return sessionRecord{}, 0, classify(ctx, err)
	}
	if len(resp.Kvs) == 0 {
		return sessionRecord{}, 0, fmt.Errorf("%w: session %s is unknown, expired or closed", store.ErrSessionDead, id)
	}
	var rec sessionRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil || rec.Lease == 0 || rec.TTLms <= 0 {
		return sessionRecord{}, 0, fmt.Errorf("%w: session %s: malformed session record", store.ErrSessionDead, id)
	}
	if s.exclusive && rec.Epoch != s.shift {
		return sessionRecord{}, 0, fmt.Errorf("%w: session %s belongs to an earlier epoch of this embedded etcd", store.ErrSessionDead, id)
	}
	return rec, resp.Kvs[0].CreateRevision, nil
}

// lookup returns session id as this Store knows it, adopting it from its
// record when it does not (one read and one write, then cached): this
// Store then keeps its lease alive too. ErrSessionDead for an unknown or
// dead session. Every call through it counts as a use of the session
// (an adopted session unused for a TTL is dropped, keepalive.go).
func (s *Store) lookup(ctx context.Context, id store.SessionID) (*session, error) {
	now := time.Now()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	if ss := s.sessions[id]; ss != nil {
		dead := ss.dead
		s.mu.Unlock()
		if dead {
			return nil, fmt.Errorf("%w: session %s is unknown, expired or closed", store.ErrSessionDead, id)
		}
		s.keep.touch(ss, now)
		return ss, nil
	}
	s.mu.Unlock()
	return s.adopt(ctx, id)
}

// adopt reads session id's record and starts keeping its lease alive,
// after writing this Store's keeper record iff the session record still
// exists (a session ExpireSession ended is dead for every Store).
func (s *Store) adopt(ctx context.Context, id store.SessionID) (*session, error) {
	rec, createRev, err := s.readRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	lease := clientv3.LeaseID(rec.Lease)
	resp, err := s.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(s.recordKey(id)), "=", createRev),
	).Then(
		clientv3.OpPut(s.keeperKey(id), "", clientv3.WithLease(lease)),
		// Its lock-delay companion leases: kept alive here too (delay.go).
		clientv3.OpGet(s.companionPrefix(id), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, classify(ctx, err) // a lease gone between the read and the put: ErrSessionDead
	}
	if !resp.Succeeded {
		return nil, fmt.Errorf("%w: session %s ended while being adopted", store.ErrSessionDead, id)
	}
	companions := s.parseCompanions(id, resp.Responses[1].GetResponseRange().Kvs)
	ss := &session{
		id:         id,
		lease:      lease,
		ttl:        time.Duration(rec.TTLms) * time.Millisecond,
		done:       make(chan struct{}),
		secretHash: rec.Hash,
		principal:  rec.Principal,
		adopted:    true,
		keeperRev:  resp.Header.Revision,
		held:       make(map[string]uint64),
		queued:     make(map[string]bool),
		companions: companions,
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	if cur := s.sessions[id]; cur != nil {
		// Adopted by a concurrent call meanwhile (or found dead): that
		// record wins. The keeper record is the same key, so it stays.
		if cur.dead {
			return nil, deadErr(cur)
		}
		return cur, nil
	}
	s.sessions[id] = ss
	s.keep.adopt(ss, time.Now())
	// The session record was there to adopt: an ExpireSession of it with
	// an unknown outcome did not end it (expire.go).
	s.dropUnsureLocked(id)
	return ss, nil
}

// recordOf returns what a read-only call (SessionSecretHash,
// SessionPrincipal) needs of session id: this Store's record, or the one in
// etcd, which it does not adopt (checking a caller's secret keeps nothing
// alive).
func (s *Store) recordOf(ctx context.Context, id store.SessionID) (hash []byte, principal string, err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, "", errClosed
	}
	if ss := s.sessions[id]; ss != nil {
		dead := ss.dead
		s.mu.Unlock()
		if dead {
			return nil, "", store.ErrSessionDead
		}
		return ss.secretHash, ss.principal, nil
	}
	s.mu.Unlock()
	rec, _, err := s.readRecord(ctx, id)
	if err != nil {
		return nil, "", err
	}
	return rec.Hash, rec.Principal, nil
}

// endIfUnkept withdraws this Store's keeper record of session id (the one
// it wrote at revision keeperRev; 0: none known) and, in the same
// transaction, deletes the session record iff no other Store has a keeper
// record and no other Store has claimed the session's end (a CloseSession
// under way, end.go), claiming the end for this Store as it does. Only then
// (ended) may the caller revoke the lease and record the end: no other
// replica serves the session, none can adopt it any more, and a close
// through another replica finds the claim and records nothing (C4
// #ct4-replica-count). This Store's own claim (its CloseSession that failed
// after claiming) does not stop it: a second transaction then ends the
// session under that claim, which records the end here as the close would
// have. exists reports whether the session record was still there.
func (s *Store) endIfUnkept(ctx context.Context, id store.SessionID, keeperRev int64) (ended, exists bool, err error) {
	renewed, own := false, false
	for {
		marker, err := s.marks.lease(ctx)
		if err != nil {
			return false, false, classify(ctx, err)
		}
		var ownClaim bool
		ended, exists, ownClaim, err = s.endIfUnkeptTxn(ctx, id, keeperRev, marker, own)
		if err != nil && !renewed && s.marks.gone(err, marker) {
			renewed = true
			continue // the marker lease ended early: a new one
		}
		if err != nil {
			return false, false, classify(ctx, err)
		}
		if !ended && exists && ownClaim && !own {
			// The claim is this Store's own. The transaction withdrew the
			// keeper record written at keeperRev (if it was still that
			// one): the next finds none of this Store's unless it was not.
			own, keeperRev = true, 0
			continue
		}
		return ended, exists, nil
	}
}

// endIfUnkeptTxn is endIfUnkept's transaction, its end marker on the
// release-marker lease marker; own: the end marker there is this Store's
// (no end marker: none may be there). ownClaim reports, when the
// transaction did not end the session, whether this Store's end marker
// was there. The errors are not classified.
func (s *Store) endIfUnkeptTxn(ctx context.Context, id store.SessionID, keeperRev int64, marker clientv3.LeaseID, own bool) (ended, exists, ownClaim bool, err error) {
	rk, kp, mine, ek := s.recordKey(id), s.keeperPrefix(id), s.keeperKey(id), s.endKey(id)
	end := clientv3.GetPrefixRangeEnd(kp)
	// No claim of the end: a Store closing the session ends it. Or, own,
	// this Store's claim.
	claim := clientv3.Compare(clientv3.CreateRevision(ek), "=", 0)
	if own {
		claim = clientv3.Compare(clientv3.Value(ek), "=", s.inst)
	}
	conds := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(rk), ">", 0),
		// No keeper record before mine, and none after it.
		clientv3.Compare(clientv3.CreateRevision(kp), "=", 0).WithRange(mine),
		clientv3.Compare(clientv3.CreateRevision(mine+"\x00"), "=", 0).WithRange(end),
		claim,
	}
	withdraw := []clientv3.Op{}
	if keeperRev > 0 {
		conds = append(conds, clientv3.Compare(clientv3.ModRevision(mine), "=", keeperRev))
		withdraw = append(withdraw, clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(mine), "=", keeperRev)},
			[]clientv3.Op{clientv3.OpDelete(mine)}, nil))
	} else {
		// A keeper record of mine that this Store no longer knows about
		// (an idle drop whose delete failed) counts as another keeper.
		conds = append(conds, clientv3.Compare(clientv3.CreateRevision(mine), "=", 0))
	}
	resp, err := s.cli.Txn(ctx).If(conds...).
		Then(clientv3.OpDelete(rk), clientv3.OpDelete(mine), clientv3.OpPut(ek, s.inst, clientv3.WithLease(marker))).
		Else(append(withdraw, clientv3.OpGet(ek), clientv3.OpGet(rk, clientv3.WithCountOnly()))...).Commit()
	if err != nil {
		return false, false, false, err
	}
	if resp.Succeeded {
		return true, true, false, nil
	}
	n := len(resp.Responses)
	claimKvs := resp.Responses[n-2].GetResponseRange().Kvs
	ownClaim = len(claimKvs) > 0 && string(claimKvs[0].Value) == s.inst
	return false, resp.Responses[n-1].GetResponseRange().Count > 0, ownClaim, nil
}

// leaseBound is a lower bound, from now, of how long lease lives, from one
// TimeToLive: at least minExpireRetry while it exists. ErrSessionDead when
// it is gone.
func (s *Store) leaseBound(ctx context.Context, lease clientv3.LeaseID) (time.Duration, error) {
	sent := time.Now()
	resp, err := s.cli.TimeToLive(ctx, lease)
	if err != nil {
		return 0, classify(ctx, err)
	}
	if resp.TTL < 0 {
		return 0, fmt.Errorf("%w: lease gone", store.ErrSessionDead)
	}
	return max(time.Until(sent.Add(time.Duration(resp.TTL)*time.Second)), minExpireRetry), nil
}

// dropIdle forgets an adopted session that no call used for a TTL (the
// keeper stopped keeping its lease) and withdraws its keeper record, iff
// it is still the one written at adoption (a re-adoption since wrote a new
// one). The keeper calls it with its lock released.
func (s *Store) dropIdle(ss *session) {
	s.mu.Lock()
	if s.sessions[ss.id] == ss && !ss.dead {
		delete(s.sessions, ss.id)
	}
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() { // exits after one bounded delete
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
		defer cancel()
		mine := s.keeperKey(ss.id)
		// Best effort: a record left behind only makes the session end by
		// lease expiry instead of at once (C2 #ct2-replicas).
		s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(mine), "=", ss.keeperRev)).Then(clientv3.OpDelete(mine)).Commit() //nolint:errcheck
	}()
}
