package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// deadRetention is how long a dead session is remembered; afterwards it is
// unknown, which is reported the same way (not live).
const deadRetention = 10 * time.Minute

// session is one session of this Store: exactly one etcd lease.
type session struct {
	id    store.SessionID
	lease clientv3.LeaseID
	ttl   time.Duration // as granted by etcd
	done  chan struct{} // closed when the session stops being live
	// secretHash is the owner's secret hash (C2 #ct2-ownership), fixed at
	// open; nil for none.
	secretHash []byte
	// principal is the principal the session is bound to (principal.go).
	principal string
	// adopted: opened by another Store (or an earlier process) and taken
	// up from its session record (record.go); kept alive only while used.
	adopted bool
	// keeperRev is the revision of this Store's keeper record of the
	// session (record.go), fixed when it was written.
	keeperRev int64
	// owner and labels are the holder identity given at open (C2
	// #ct2-holder), fixed; kept here for ListSessions.
	owner  string
	labels map[string]string

	// Guarded by Store.mu.
	dead   bool
	deadAt time.Time
	held   map[string]uint64 // grants made through this Store (a cache; key → token)
	// heldGen counts changes to held: LocksOf reconciles held with what it
	// read only if nothing changed it meanwhile (a grant made after the
	// read would otherwise drop out of the cache, and its release go
	// uncounted).
	heldGen uint64
	// queued holds the keys of held grants that this session waited for in
	// the queue: others likely wait too, so their release looks at the
	// queue first (see DeleteIfOwner). A hint only.
	queued map[string]bool
	// multi holds the keys of held grants that are semaphore or read/write
	// slots (multi.go); nil until the first.
	multi map[string]bool

	// holds are the maximum-hold timers of its grants, by key (delay.go);
	// guarded by Store.mu.
	holds map[string]*time.Timer
	// companions are its companion leases by lock-delay (delay.go), kept
	// alive with its lease; guarded by keeper.mu.
	companions map[time.Duration]clientv3.LeaseID

	// ka is the lease's keepalive state and proven bound, guarded by
	// keeper.mu (keepalive.go).
	ka kaState
}

// OpenSession grants one lease with ttl rounded up to whole seconds.
func (s *Store) OpenSession(ctx context.Context, ttl time.Duration, opts ...store.SessionOption) (_ store.Session, err error) {
	start := time.Now()
	defer s.met.Observe(telemetry.OpOpenSession)(&err)
	if err := store.ValidateTTL(ttl); err != nil {
		return store.Session{}, fmt.Errorf("etcdstore: open session: %w", err)
	}
	o, err := store.NewSessionOptions(opts...)
	if err != nil {
		return store.Session{}, fmt.Errorf("etcdstore: open session: %w", err)
	}
	if err := s.ready(ctx); err != nil {
		return store.Session{}, fmt.Errorf("etcdstore: open session: %w", err)
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	sent := time.Now()
	resp, err := s.cli.Grant(ctx, secs)
	if err == nil && resp.Error != "" {
		err = errors.New(resp.Error)
	}
	if err != nil {
		return store.Session{}, fmt.Errorf("etcdstore: open session: %w", classify(ctx, err))
	}
	granted := time.Duration(resp.TTL) * time.Second
	id := store.NewSessionID()
	// The session record (hash, principal, lease: what any Store needs to
	// adopt it), this Store's keeper record and the holder record, on the
	// lease (record.go, C2 #ct2-replicas).
	ops, err := s.openOps(id, resp.ID, granted, o)
	var tr *clientv3.TxnResponse
	if err == nil {
		tr, err = s.cli.Txn(ctx).Then(ops...).Commit()
	}
	if err != nil {
		s.revokeNow(resp.ID)
		return store.Session{}, fmt.Errorf("etcdstore: open session: %w", classify(ctx, err))
	}
	ss := &session{
		id:         id,
		lease:      resp.ID,
		ttl:        granted,
		done:       make(chan struct{}),
		secretHash: o.SecretHash,
		principal:  o.Principal,
		keeperRev:  tr.Header.Revision,
		owner:      o.Owner,
		labels:     o.Labels,
		held:       make(map[string]uint64),
		queued:     make(map[string]bool),
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.revokeNow(resp.ID)
		return store.Session{}, errClosed
	}
	s.sessions[ss.id] = ss
	s.keep.add(ss, sent)
	rem := s.keep.remaining(ss, start)
	s.mu.Unlock()
	s.log.SessionOpened(ss.id, granted)
	s.met.SessionOpened()
	return store.Session{ID: ss.id, TTL: granted, Remaining: rem}, nil
}

// Heartbeat reports the session's liveness and deadline bound. It sends no
// keepalive: the Store's keepalive stream keeps every session alive (see the
// package doc). When the bound has run out it asks etcd once; if etcd cannot
// answer that is a retryable error, never "not live".
func (s *Store) Heartbeat(ctx context.Context, id store.SessionID) (_ store.Liveness, err error) {
	now := time.Now()
	defer s.met.Observe(telemetry.OpHeartbeat)(&err)
	if err := store.ValidateSessionID(id); err != nil {
		return store.Liveness{}, fmt.Errorf("etcdstore: heartbeat: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return store.Liveness{}, fmt.Errorf("etcdstore: heartbeat: %w", err)
	}
	ss, err := s.lookup(ctx, id) // adopts a session opened elsewhere
	switch {
	case errors.Is(err, store.ErrSessionDead):
		return store.Liveness{}, nil
	case err != nil:
		return store.Liveness{}, fmt.Errorf("etcdstore: heartbeat: %w", err)
	}
	s.mu.Lock()
	if ss.dead {
		s.mu.Unlock()
		return store.Liveness{}, nil
	}
	if rem := s.keep.remaining(ss, now); rem > 0 {
		s.mu.Unlock()
		return store.Liveness{Live: true, Remaining: rem}, nil
	}
	s.mu.Unlock()

	// Adopted a moment ago: this Store's own first keepalive, sent at
	// adoption, proves the full TTL from its send once answered, where a
	// TimeToLive probe proves only what etcd reports left, in whole
	// seconds, floored (C2 #ct2-replicas). Wait for it, as long as the
	// keeper itself waits for an answer before it gives the stream up.
	if first := s.keep.firstAnswer(ss); first != nil {
		if s.waitingFirst != nil {
			s.waitingFirst()
		}
		t := time.NewTimer(overdueAfter(ss.ttl))
		select {
		case <-first:
		case <-t.C:
		case <-ctx.Done():
		case <-s.ctx.Done(): // Close: the keeper is gone
		}
		t.Stop()
		s.mu.Lock()
		dead := ss.dead
		rem := s.keep.remaining(ss, now)
		s.mu.Unlock()
		switch {
		case dead:
			return store.Liveness{}, nil
		case rem > 0:
			return store.Liveness{Live: true, Remaining: rem}, nil
		}
	}

	// No answered keepalive covers now: probe the lease.
	pctx, cancel := context.WithTimeout(ctx, probeTimeout(ss.ttl))
	defer cancel()
	sent := time.Now()
	resp, err := s.cli.TimeToLive(pctx, ss.lease)
	if err != nil {
		err = classify(ctx, err)
		if errors.Is(err, store.ErrSessionDead) {
			s.markDead(ss, telemetry.LostLeaseExpired)
			return store.Liveness{}, nil
		}
		return store.Liveness{}, fmt.Errorf("etcdstore: heartbeat: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case ss.dead:
		return store.Liveness{}, nil
	case resp.TTL < 0:
		s.markDeadLocked(ss, telemetry.LostLeaseExpired)
		return store.Liveness{}, nil
	case resp.TTL == 0:
		// The lease exists with under a second left and no keepalive of
		// ours has been answered for a TTL: nothing to promise, but not
		// known dead either.
		return store.Liveness{}, fmt.Errorf("%w: etcdstore: heartbeat: lease under a second from expiry and no keepalive answered", store.ErrUnavailable)
	}
	s.keep.extend(ss, sent.Add(time.Duration(resp.TTL)*time.Second))
	return store.Liveness{Live: true, Remaining: s.keep.remaining(ss, now)}, nil
}

// CloseSession revokes the session's lease: every key attached to it
// vanishes in one step. It returns the number of grants that held. For a
// session opened here that is the Store's own record of the session's
// grants (the grants it made or handed to the session and has not seen
// end), not a listing of the lease's keys first: that listing would cost a
// round trip, and the transfer of every key name, before the one revoke. A
// grant revoked through another Store instance is still counted (LocksOf
// reconciles the record with etcd). For a session opened elsewhere
// (adopted, or unknown here: read from its record) the grants attached to
// its lease are read (keys and tokens) and logged, since grants may have
// gone through any Store.
//
// Before the revoke it claims the session's end (end.go, C4
// #ct4-replica-count): when another Store's claim is there, that Store
// ended the session and recorded it, and this close returns 0 and records
// nothing (a client's close tried again through another replica, or two
// closes at once).
//
// A close is voluntary: it also revokes the session's lock-delay companion
// leases, so its keys are handed over at once; an involuntary end
// (ExpireSession, expire.go) lets them run out (delay.go).
func (s *Store) CloseSession(ctx context.Context, id store.SessionID) (n int, err error) {
	defer s.met.Observe(telemetry.OpCloseSession)(&err)
	if err := store.ValidateSessionID(id); err != nil {
		return 0, fmt.Errorf("etcdstore: close session: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("etcdstore: close session: %w", err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, errClosed
	}
	ss := s.sessions[id]
	if ss != nil && ss.dead {
		delete(s.sessions, id)
		s.mu.Unlock()
		return 0, nil
	}
	s.mu.Unlock()

	var lease clientv3.LeaseID
	if ss != nil {
		lease = ss.lease
	} else {
		rec, _, err := s.readRecord(ctx, id)
		if errors.Is(err, store.ErrSessionDead) {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("etcdstore: close session: %w", err)
		}
		lease = clientv3.LeaseID(rec.Lease)
	}
	// Claim the end before ending it (end.go, C4 #ct4-replica-count): a
	// session another Store ended is not recorded again here, whether its
	// client tries the close again through this Store or not.
	mine, err := s.claimEnd(ctx, id)
	if afterCloseClaim != nil {
		afterCloseClaim(id)
	}
	if err != nil {
		return 0, fmt.Errorf("etcdstore: close session: %w", err)
	}
	if !mine {
		if ss != nil {
			s.mu.Lock()
			s.endQuietLocked(ss)
			delete(s.sessions, id)
			s.mu.Unlock()
		}
		return 0, nil
	}
	var (
		grants     []store.Grant // read from etcd: a session opened elsewhere
		read       = ss == nil || ss.adopted
		companions []clientv3.LeaseID // recorded in etcd (delay.go)
	)
	if read {
		grants, err = s.locksOfDirect(ctx, &session{id: id, lease: lease})
		if err != nil && !errors.Is(err, store.ErrSessionDead) { // dead: the revoke below says so
			return 0, fmt.Errorf("etcdstore: close session: %w", err)
		}
		// Other Stores may have given it lock-delay companions: they are
		// recorded on its lease, so read before the revoke.
		if companions, err = s.companionsOf(ctx, id); err != nil {
			return 0, fmt.Errorf("etcdstore: close session: %w", err)
		}
	}
	// Within the keeper's bound when the revoke is sent, etcd cannot have
	// expired the lease before the revoke arrives (the bound is a renewal's
	// send time + TTL). clientv3 retries LeaseRevoke on UNAVAILABLE (a
	// repeatable call): when a first attempt applied but its reply was
	// lost, the retry finds no lease, and this close released the locks
	// (no other Store did: this Store holds the end's claim).
	trusted := ss != nil && s.keep.remaining(ss, time.Now()) > 0
	if _, err := s.cli.Revoke(ctx, lease); err != nil {
		err = classify(ctx, err)
		if !errors.Is(err, store.ErrSessionDead) {
			return 0, fmt.Errorf("etcdstore: close session: %w", err)
		}
		if !trusted { // the lease was already gone
			if ss != nil {
				s.markDead(ss, telemetry.LostLeaseExpired)
				s.forget(id)
			}
			return 0, nil
		}
	}

	// A close is voluntary: its keys are handed over at once, so the
	// lock-delay companion leases go too (delay.go). Best effort: a
	// companion left behind runs out by itself.
	if ss != nil {
		companions = append(companions, s.keep.takeCompanions(ss)...)
	}
	slices.Sort(companions)
	for _, c := range slices.Compact(companions) {
		s.revokeNow(c)
	}
	if ss == nil {
		s.mu.Lock()
		s.releaseGrantsLocked(nil, grants, telemetry.ReleaseSessionClosed)
		s.mu.Unlock()
		s.log.SessionClosed(ctx, id, len(grants))
		return len(grants), nil
	}
	s.mu.Lock()
	if !ss.dead {
		ss.dead, ss.deadAt = true, time.Now()
		close(ss.done)
		stopHoldLocked(ss, "")
		s.keep.remove(ss)
		if read {
			n = len(grants)
			s.releaseGrantsLocked(ss, grants, telemetry.ReleaseSessionClosed)
		} else {
			n = len(ss.held)
			s.releaseHeldLocked(ss, telemetry.ReleaseSessionClosed)
		}
		s.log.SessionClosed(ctx, id, n)
		if !ss.adopted {
			s.met.SessionEnded("")
		}
	}
	delete(s.sessions, id)
	s.mu.Unlock()
	return n, nil
}

// afterLocksOfRead, when set (tests only), runs in LocksOf between its read
// and its reconciling of the cache.
var afterLocksOfRead func()

// LocksOf lists the session's grants as etcd has them at a point between
// the call's start and its return: from the held-set index once a round's
// linearizable read has shown it current (held.go), else (the index not
// ready) read directly, the keys attached to its lease.
func (s *Store) LocksOf(ctx context.Context, id store.SessionID) (_ []store.Grant, err error) {
	defer s.met.Observe(telemetry.OpLocksOf)(&err)
	ss, err := s.live(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: locks of: %w", err)
	}
	s.mu.Lock()
	gen := ss.heldGen
	s.mu.Unlock()
	grants, direct, err := s.held.locksOf(ctx, ss)
	if direct {
		grants, err = s.locksOfDirect(ctx, ss)
	}
	if afterLocksOfRead != nil {
		afterLocksOfRead()
	}
	if err != nil {
		if errors.Is(err, store.ErrSessionDead) {
			s.markDead(ss, telemetry.LostLeaseExpired)
		}
		return nil, fmt.Errorf("etcdstore: locks of: %w", err)
	}
	s.mu.Lock()
	// Reconcile the cache (grants revoked through another instance), unless
	// a grant or release through this Store changed it since the read.
	if !ss.dead && ss.heldGen == gen {
		held := make(map[string]uint64, len(grants))
		for _, g := range grants {
			held[g.Key] = g.Token
		}
		s.met.LocksHeld(len(held) - len(ss.held))
		ss.held = held
	}
	s.mu.Unlock()
	return grants, nil
}

// locksOfDirect reads the session's grants itself: the keys attached to its
// lease (one TimeToLive), then those keys. The errors are classified.
func (s *Store) locksOfDirect(ctx context.Context, ss *session) ([]store.Grant, error) {
	id := ss.id
	ttl, err := s.cli.TimeToLive(ctx, ss.lease, clientv3.WithAttachedKeys())
	if err == nil && ttl.TTL < 0 {
		return nil, fmt.Errorf("%w: lease gone", store.ErrSessionDead)
	}
	if err != nil {
		return nil, classify(ctx, err)
	}
	var ops []clientv3.Op
	for _, k := range ttl.Keys {
		if _, ok := s.userKey(k); ok || s.isSlotKey(k) {
			ops = append(ops, clientv3.OpGet(string(k)))
		}
	}
	var grants []store.Grant
	for chunk := range slices.Chunk(ops, 100) {
		resp, err := s.cli.Txn(ctx).Then(chunk...).Commit()
		if err != nil {
			return nil, classify(ctx, err)
		}
		for _, r := range resp.Responses {
			for _, kv := range r.GetResponseRange().Kvs {
				if g, ok := s.multiGrantOf(kv, id, ss.lease); ok {
					grants = append(grants, g)
					continue
				}
				key, _ := s.userKey(kv.Key)
				holder, at, err := parseGrant(kv.Value)
				if err != nil || holder != id || clientv3.LeaseID(kv.Lease) != ss.lease {
					continue // released since TimeToLive read it, or foreign data
				}
				grants = append(grants, store.Grant{Key: key, Session: id, Token: s.token(kv.ModRevision), AcquiredAt: at})
			}
		}
	}
	slices.SortFunc(grants, func(a, b store.Grant) int { return strings.Compare(a.Key, b.Key) })
	return grants, nil
}

// sessionErr classifies err from a write with the session's lease; a
// missing lease makes the session dead.
func (s *Store) sessionErr(ctx context.Context, ss *session, err error) error {
	err = classify(ctx, err)
	if errors.Is(err, store.ErrSessionDead) {
		s.markDead(ss, telemetry.LostLeaseExpired)
	}
	return err
}

// live returns the session if it is live, adopting it from its session
// record when this Store does not know it (record.go), else
// ErrSessionDead (or the ctx error, or errClosed).
func (s *Store) live(ctx context.Context, id store.SessionID) (*session, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.lookup(ctx, id)
}

// isDone reports whether the session has stopped being live (it is dead);
// unlike dead it may be read without Store.mu.
func (ss *session) isDone() bool {
	select {
	case <-ss.done:
		return true
	default:
		return false
	}
}
