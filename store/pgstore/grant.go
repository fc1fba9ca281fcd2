package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// outcome is what one grant attempt found.
type outcome int

const (
	granted  outcome = iota + 1 // a new grant was made
	held                        // the session already held the key
	busy                        // another session holds the key or is ahead in its queue
	dead                        // the session is not live
	mismatch                    // the key is a semaphore or read/write lock (multi.go)
)

// grant tries, inside tx, to grant key to session id. With asWaiter false
// (TryInsert) any queued waiter makes the key busy; with asWaiter true
// (Acquire) the session takes the key only when it is free and the session
// is first in the queue (or the queue is empty), and otherwise makes sure it
// is queued. A waiter that finds its session dead or the key granted to it
// leaves the queue in the same transaction.
func (s *Store) grant(ctx context.Context, tx pgx.Tx, id store.SessionID, key string, asWaiter, nodl bool) (store.Grant, outcome, error) {
	sid := string(id)
	dequeue := func() error {
		if !asWaiter {
			return nil
		}
		_, err := tx.Exec(ctx, s.q.dequeue, key, sid)
		return err
	}
	enqueue := func() error {
		if !asWaiter {
			return nil
		}
		_, err := tx.Exec(ctx, s.q.enqueue, key, sid, nodl)
		return err
	}

	// The key's lock first, then the look: see the token reasoning below.
	if _, err := tx.Exec(ctx, s.q.keyLock, []string{key}); err != nil {
		return store.Grant{}, 0, err
	}
	var (
		remainingUS int64
		holder      *string
		tok         *int64
		at          *time.Time
		head        *string
		multi       bool
		delayed     bool
	)
	err := tx.QueryRow(ctx, s.q.grantCheck, sid, key).Scan(&remainingUS, &holder, &tok, &at, &head, &multi, &delayed)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && remainingUS <= 0 {
		// Unknown, closed, reaped, or expired and awaiting the reaper. An
		// expired waiter leaves the queue now so nobody waits behind it.
		return store.Grant{}, dead, dequeue()
	}
	if err != nil {
		return store.Grant{}, 0, err
	}
	g := store.Grant{Key: key, Session: id, Remaining: time.Duration(remainingUS) * time.Microsecond}
	switch {
	case holder != nil && *holder == sid:
		g.Token, g.AcquiredAt = uint64(*tok), *at
		return g, held, dequeue()
	case holder != nil:
		return store.Grant{}, busy, enqueue()
	case multi:
		return store.Grant{}, mismatch, dequeue()
	case delayed: // a lock-delay running (delay.go)
		return store.Grant{}, busy, enqueue()
	case head != nil && (!asWaiter || *head != sid):
		// TryInsert never jumps a queue; a waiter takes the key only first
		// in line. The key is free, so the first waiter should be taking
		// it: wake it, in case the wake-up it had went to another waiter
		// (nudgeHead).
		if _, err := tx.Exec(ctx, s.q.nudgeHead, key, *head); err != nil {
			return store.Grant{}, 0, err
		}
		return store.Grant{}, busy, enqueue()
	}

	// The fencing token is drawn in the INSERT, under the key's advisory
	// lock (keyLock), which every grant takes before it draws a token and
	// holds until it commits.
	//
	// Why this is strictly increasing per key: let P be an earlier grant of
	// this key. P held the key's lock from before it drew its token until
	// it committed, and we took the lock after that (had we taken it
	// first, P would have waited for our commit, and P would have found our
	// row, or been a later grant). So P's token was drawn before ours, and
	// the sequence is monotonic across transactions and never rolled back.
	// The lock is what makes drawing the token in the INSERT safe: nextval
	// runs before the uniqueness check, and without the lock a statement
	// could draw a token, wait on a conflicting row (one being deleted),
	// and insert after another grant of the key drew a larger one,
	// committed and was released. With the lock, no other grant of the key
	// can commit meanwhile; only deletes can, which draw nothing.
	var token int64
	err = tx.QueryRow(ctx, s.q.insertLock, key, sid).Scan(&token, &g.AcquiredAt)
	if errors.Is(err, pgx.ErrNoRows) {
		// The key was taken after we looked, which the key lock rules out
		// for grants of this schema; read the holder all the same.
		holder, tok, at, found, err := s.holder(ctx, tx, key)
		switch {
		case err != nil:
			return store.Grant{}, 0, err
		case found && holder == id:
			g.Token, g.AcquiredAt = tok, at
			return g, held, dequeue()
		}
		return store.Grant{}, busy, enqueue()
	}
	if err != nil {
		return store.Grant{}, 0, err
	}
	g.Token = uint64(token)
	// The granted session leaves the key's queue if it was in it.
	if _, err := tx.Exec(ctx, s.q.dequeue, key, sid); err != nil {
		return store.Grant{}, 0, err
	}
	return g, granted, nil
}

// holder reads the key's current grant.
func (s *Store) holder(ctx context.Context, tx pgx.Tx, key string) (store.SessionID, uint64, time.Time, bool, error) {
	var sid string
	var tok int64
	var at time.Time
	err := tx.QueryRow(ctx, s.q.holder, key).Scan(&sid, &tok, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, time.Time{}, false, nil
	}
	return store.SessionID(sid), uint64(tok), at, err == nil, err
}

// validateGrantArgs checks a session id and a key.
func validateGrantArgs(op string, id store.SessionID, key string) error {
	if err := store.ValidateSessionID(id); err != nil {
		return fmt.Errorf("pgstore: %s: %w", op, err)
	}
	if err := store.ValidateKey(key); err != nil {
		return fmt.Errorf("pgstore: %s: %w", op, err)
	}
	return nil
}

// newGrant records the telemetry of a new grant.
func (s *Store) newGrant(g store.Grant, waited time.Duration) {
	s.log.LockAcquired(g, waited)
	s.metrics.Acquire(telemetry.AcquireGranted, waited)
	s.metrics.LocksHeld(1)
}

// acquireFailed records the acquire outcome of an Acquire or TryInsert
// that fails with err (C4 #ct4-acquire-result) and returns err.
func (s *Store) acquireFailed(ctx context.Context, err error) error {
	s.metrics.Acquire(telemetry.AcquireResult(ctx, err), 0)
	return err
}

// TryInsert implements store.LockStore. Concurrent grants and releases
// share one transaction (group commit, groupcommit.go).
func (s *Store) TryInsert(ctx context.Context, id store.SessionID, key string, opts ...store.AcquireOption) (_ store.Grant, _ bool, err error) {
	if err := validateGrantArgs("try insert", id, key); err != nil {
		return store.Grant{}, false, s.acquireFailed(ctx, err)
	}
	o, err := store.NewAcquireOptions(opts...)
	if err != nil {
		return store.Grant{}, false, s.acquireFailed(ctx, fmt.Errorf("pgstore: try insert: %w", err))
	}
	if err := s.begin(ctx, "try insert"); err != nil {
		return store.Grant{}, false, s.acquireFailed(ctx, err)
	}
	defer s.metrics.Observe(telemetry.OpTryInsert)(&err)
	if o.Multi() {
		return s.tryMulti(ctx, id, key, o) // multi.go
	}
	r, err := s.doLock(ctx, "try insert", &lockReq{op: opTry, id: id, key: key})
	if err != nil {
		return store.Grant{}, false, s.acquireFailed(ctx, err)
	}
	g := r.g
	switch r.out {
	case granted:
		s.newGrant(g, 0)
		return g, true, nil
	case held:
		s.metrics.Acquire(telemetry.AcquireGranted, 0)
		return g, true, nil
	case busy:
		s.metrics.Acquire(telemetry.AcquireContended, 0)
		return store.Grant{}, false, nil
	case mismatch:
		return store.Grant{}, false, s.acquireFailed(ctx, fmt.Errorf("pgstore: try insert: %w", errMismatch(key, store.AcquireOptions{Limit: 1})))
	}
	return store.Grant{}, false, s.acquireFailed(ctx, fmt.Errorf("pgstore: try insert: %w", store.ErrSessionDead))
}

// DeleteIfOwner implements store.LockStore. The row is deleted only if key,
// session and token all match and the session is live. Concurrent releases
// and grants share one transaction (group commit, groupcommit.go).
func (s *Store) DeleteIfOwner(ctx context.Context, id store.SessionID, key string, token uint64) (err error) {
	if err := validateGrantArgs("release", id, key); err != nil {
		return err
	}
	if err := s.begin(ctx, "release"); err != nil {
		return err
	}
	if token == 0 || token > 1<<63-1 {
		return fmt.Errorf("pgstore: release: token %d was never issued: %w", token, store.ErrNotOwner)
	}
	defer s.metrics.Observe(telemetry.OpRelease)(&err)
	r, err := s.doLock(ctx, "release", &lockReq{op: opRelease, id: id, key: key, token: token})
	if err != nil {
		return err
	}
	if r.out != freed {
		return s.releaseSlot(ctx, id, key, token) // a slot, or not owned (multi.go)
	}
	s.log.LockReleased(r.g, telemetry.ReleaseRelease)
	s.metrics.Released(telemetry.ReleaseRelease, 1)
	return nil
}

// Revoke implements store.LockStore.
func (s *Store) Revoke(ctx context.Context, key string) (_ store.Grant, _ bool, err error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Grant{}, false, fmt.Errorf("pgstore: revoke: %w", err)
	}
	if err := s.begin(ctx, "revoke"); err != nil {
		return store.Grant{}, false, err
	}
	defer s.metrics.Observe(telemetry.OpRevoke)(&err)
	g := store.Grant{Key: key}
	var sid string
	var tok int64
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, s.q.revoke, key).Scan(&sid, &tok, &g.AcquiredAt)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return s.revokeSlots(ctx, key) // a semaphore or read/write key, or free (multi.go)
	}
	if err = classify(ctx, "revoke", err); err != nil {
		return store.Grant{}, false, err
	}
	g.Session, g.Token = store.SessionID(sid), uint64(tok)
	// The revoke is committed and visible: its lock-delay's end can be
	// stamped now (delay.go); if this fails the reaper stamps it.
	_ = s.stampDelays(ctx)
	s.log.LockRevoked(ctx, key, g.Token)
	s.log.LockReleased(g, telemetry.ReleaseRevoked)
	s.metrics.Released(telemetry.ReleaseRevoked, 1)
	return g, true, nil
}

// SetValue implements store.ValueSetter: one UPDATE of the grant's row, iff
// (session, key, token) is the current grant of a live session, and its
// value event (a NOTIFY in the same statement).
func (s *Store) SetValue(ctx context.Context, id store.SessionID, key string, token uint64, value []byte) (err error) {
	if err := validateGrantArgs("set value", id, key); err != nil {
		return err
	}
	if err := store.ValidateValue(value); err != nil {
		return fmt.Errorf("pgstore: set value: %w", err)
	}
	if err := s.begin(ctx, "set value"); err != nil {
		return err
	}
	if token == 0 || token > 1<<63-1 {
		return fmt.Errorf("pgstore: set value: token %d was never issued: %w", token, store.ErrNotOwner)
	}
	if len(value) == 0 {
		value = nil
	}
	tag, err := s.pool.Exec(ctx, s.q.setValue, key, string(id), int64(token), value, s.channel)
	if err = classify(ctx, "set value", err); err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return s.setSlotValue(ctx, id, key, token, value) // a slot, or not owned (multi.go)
	}
	return nil
}
