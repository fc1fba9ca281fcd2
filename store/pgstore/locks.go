package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// outcome is what one grant attempt found.
type outcome int

const (
	granted outcome = iota + 1 // a new grant was made
	held                       // the session already held the key
	busy                       // another session holds the key or is ahead in its queue
	dead                       // the session is not live
)

// grant tries, inside tx, to grant key to session id. With asWaiter false
// (TryInsert) any queued waiter makes the key busy; with asWaiter true
// (Acquire) the session takes the key only when it is free and the session
// is first in the queue (or the queue is empty), and otherwise makes sure it
// is queued. A waiter that finds its session dead or the key granted to it
// leaves the queue in the same transaction.
func (s *Store) grant(ctx context.Context, tx pgx.Tx, id store.SessionID, key string, asWaiter bool) (store.Grant, outcome, error) {
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
		_, err := tx.Exec(ctx, s.q.enqueue, key, sid)
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
	)
	err := tx.QueryRow(ctx, s.q.grantCheck, sid, key).Scan(&remainingUS, &holder, &tok, &at, &head)
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

// TryInsert implements store.LockStore. Concurrent grants and releases
// share one transaction (group commit, groupcommit.go).
func (s *Store) TryInsert(ctx context.Context, id store.SessionID, key string) (store.Grant, bool, error) {
	if err := validateGrantArgs("try insert", id, key); err != nil {
		return store.Grant{}, false, err
	}
	if err := s.begin(ctx, "try insert"); err != nil {
		return store.Grant{}, false, err
	}
	start := time.Now()
	r, err := s.doLock(ctx, "try insert", &lockReq{op: opTry, id: id, key: key})
	s.metrics.Request(telemetry.OpTryInsert, start, err)
	if err != nil {
		s.metrics.Acquire(acquireResult(err), 0)
		return store.Grant{}, false, err
	}
	g := r.g
	switch r.out {
	case granted:
		s.newGrant(g, 0)
		return g, true, nil
	case held:
		return g, true, nil
	case busy:
		s.metrics.Acquire(telemetry.AcquireContended, 0)
		return store.Grant{}, false, nil
	}
	s.metrics.Acquire(telemetry.AcquireError, 0)
	return store.Grant{}, false, fmt.Errorf("pgstore: try insert: %w", store.ErrSessionDead)
}

// acquireResult is the lockd_lock_acquire_total result of a failed attempt.
func acquireResult(err error) string {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return telemetry.AcquireTimeout
	}
	return telemetry.AcquireError
}

// waiter is a local Acquire call waiting for its key.
type waiter struct {
	key     string
	session store.SessionID
	wake    chan struct{} // capacity 1: a pending wake-up is never lost
}

// addWaiter registers a waiter of session id for key, or returns
// errClosed.
func (s *Store) addWaiter(id store.SessionID, key string) (*waiter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	s.acquires.Add(1)
	w := &waiter{key: key, session: id, wake: make(chan struct{}, 1)}
	if s.waiters[key] == nil {
		s.waiters[key] = make(map[*waiter]struct{})
	}
	s.waiters[key][w] = struct{}{}
	return w, nil
}

func (s *Store) removeWaiter(w *waiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.waiters[w.key], w)
	if len(s.waiters[w.key]) == 0 {
		delete(s.waiters, w.key)
	}
	s.acquires.Done()
}

// wakeLocked wakes the local waiters of key: only those of session next
// (the key's first waiter, as the notification saw it) unless next is
// empty. s.mu is held.
//
// Waking only the first waiter spares the others an attempt each (with
// group commit, attempts for one key go one per batch, so a herd of them
// delays the one that matters). An empty next means the notifying
// transaction saw no waiter: every local waiter may then be one whose
// queue entry was not yet committed, so all are woken. A waiter can also
// become first after the notification was sent (its entry, with the
// smaller id, committed later); the attempt of whichever waiter was woken
// instead then finds the key free with another waiter first, and wakes
// that one (nudgeHead).
func (s *Store) wakeLocked(key string, next store.SessionID) {
	for w := range s.waiters[key] {
		if next != "" && w.session != next {
			continue
		}
		select {
		case w.wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// wakeAllLocked wakes every local waiter. s.mu is held.
func (s *Store) wakeAllLocked() {
	for key := range s.waiters {
		s.wakeLocked(key, "")
	}
}

// Acquire implements store.LockStore. The waiter is registered locally
// before its first look at the queue, so a notification for any change
// committed after that look wakes it; between wake-ups it holds no
// connection.
func (s *Store) Acquire(ctx context.Context, id store.SessionID, key string) (store.Grant, error) {
	if err := validateGrantArgs("acquire", id, key); err != nil {
		return store.Grant{}, err
	}
	if err := s.begin(ctx, "acquire"); err != nil {
		return store.Grant{}, err
	}
	w, err := s.addWaiter(id, key)
	if err != nil {
		return store.Grant{}, err
	}
	defer s.removeWaiter(w)
	start := time.Now()
	recheck := time.NewTimer(recheckInterval)
	defer recheck.Stop()
	for {
		opStart := time.Now()
		r, err := s.doLock(ctx, "acquire", &lockReq{op: opWait, id: id, key: key})
		s.metrics.Request(telemetry.OpAcquire, opStart, err)
		if err != nil {
			s.leaveQueue(id, key)
			s.metrics.Acquire(acquireResult(err), 0)
			return store.Grant{}, err
		}
		g := r.g
		switch r.out {
		case granted:
			s.newGrant(g, time.Since(start))
			return g, nil
		case held:
			return g, nil
		case dead:
			s.metrics.Acquire(telemetry.AcquireError, 0)
			return store.Grant{}, fmt.Errorf("pgstore: acquire: %w", store.ErrSessionDead)
		}
		recheck.Reset(recheckInterval)
		select {
		case <-w.wake:
		case <-recheck.C:
		case <-ctx.Done():
			s.leaveQueue(id, key)
			s.metrics.Acquire(telemetry.AcquireTimeout, 0)
			return store.Grant{}, fmt.Errorf("pgstore: acquire: %w", ctx.Err())
		case <-s.closing:
			s.leaveQueue(id, key)
			s.metrics.Acquire(telemetry.AcquireError, 0)
			return store.Grant{}, fmt.Errorf("pgstore: acquire: %w", errClosed)
		}
	}
}

// leaveQueue removes the session's waiter row for key, best effort, with a
// context of its own: it runs because the caller's context ended. If it
// fails, the row stays until the session ends, and a later Acquire of the
// same session and key reuses it.
func (s *Store) leaveQueue(id store.SessionID, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_, _ = s.pool.Exec(ctx, s.q.dequeue, key, string(id))
}

// DeleteIfOwner implements store.LockStore. The row is deleted only if key,
// session and token all match and the session is live. Concurrent releases
// and grants share one transaction (group commit, groupcommit.go).
func (s *Store) DeleteIfOwner(ctx context.Context, id store.SessionID, key string, token uint64) error {
	if err := validateGrantArgs("release", id, key); err != nil {
		return err
	}
	if err := s.begin(ctx, "release"); err != nil {
		return err
	}
	if token == 0 || token > 1<<63-1 {
		return fmt.Errorf("pgstore: release: token %d was never issued: %w", token, store.ErrNotOwner)
	}
	start := time.Now()
	r, err := s.doLock(ctx, "release", &lockReq{op: opRelease, id: id, key: key, token: token})
	s.metrics.Request(telemetry.OpRelease, start, err)
	if err != nil {
		return err
	}
	if r.out != freed {
		return fmt.Errorf("pgstore: release: %w", store.ErrNotOwner)
	}
	s.log.LockReleased(r.g, telemetry.ReleaseRelease)
	s.metrics.Released(telemetry.ReleaseRelease, 1)
	return nil
}

// Revoke implements store.LockStore.
func (s *Store) Revoke(ctx context.Context, key string) (store.Grant, bool, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Grant{}, false, fmt.Errorf("pgstore: revoke: %w", err)
	}
	if err := s.begin(ctx, "revoke"); err != nil {
		return store.Grant{}, false, err
	}
	start := time.Now()
	g := store.Grant{Key: key}
	var sid string
	var tok int64
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, s.q.revoke, key).Scan(&sid, &tok, &g.AcquiredAt)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		s.metrics.Request(telemetry.OpRevoke, start, nil)
		return store.Grant{}, false, nil
	}
	err = classify(ctx, "revoke", err)
	s.metrics.Request(telemetry.OpRevoke, start, err)
	if err != nil {
		return store.Grant{}, false, err
	}
	g.Session, g.Token = store.SessionID(sid), uint64(tok)
	s.log.LockRevoked(key, g.Token)
	s.log.LockReleased(g, telemetry.ReleaseRevoked)
	s.metrics.Released(telemetry.ReleaseRevoked, 1)
	return g, true, nil
}

// Inspect implements store.LockStore. Holder and waiters come from one
// statement, so one snapshot.
func (s *Store) Inspect(ctx context.Context, key string) (store.LockInfo, bool, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.LockInfo{}, false, fmt.Errorf("pgstore: inspect: %w", err)
	}
	if err := s.begin(ctx, "inspect"); err != nil {
		return store.LockInfo{}, false, err
	}
	start := time.Now()
	info := store.LockInfo{Key: key}
	var sid string
	var tok int64
	var waiters []string
	err := s.pool.QueryRow(ctx, s.q.inspect, key).Scan(&sid, &tok, &info.AcquiredAt, &waiters)
	if errors.Is(err, pgx.ErrNoRows) {
		s.metrics.Request(telemetry.OpInspect, start, nil)
		return store.LockInfo{}, false, nil
	}
	err = classify(ctx, "inspect", err)
	s.metrics.Request(telemetry.OpInspect, start, err)
	if err != nil {
		return store.LockInfo{}, false, err
	}
	info.Session, info.Token, info.Waiters = store.SessionID(sid), uint64(tok), sessionIDs(waiters)
	return info, true, nil
}

// List implements store.LockStore.
func (s *Store) List(ctx context.Context, prefix, after string, limit int) ([]store.LockInfo, error) {
	if err := store.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("pgstore: list: %w", err)
	}
	if after != "" {
		if err := store.ValidateKey(after); err != nil {
			return nil, fmt.Errorf("pgstore: list: after: %w", err)
		}
	}
	limit, err := store.ListLimit(limit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: list: %w", err)
	}
	if err := s.begin(ctx, "list"); err != nil {
		return nil, err
	}
	start := time.Now()
	var end *string
	if e, ok := prefixEnd(prefix); ok {
		end = &e
	}
	infos := []store.LockInfo{}
	rows, err := s.pool.Query(ctx, s.q.list, prefix, end, after, limit)
	if err == nil {
		var info store.LockInfo
		var sid string
		var tok int64
		var waiters []string
		_, err = pgx.ForEachRow(rows, []any{&info.Key, &sid, &tok, &info.AcquiredAt, &waiters}, func() error {
			info.Session, info.Token, info.Waiters = store.SessionID(sid), uint64(tok), sessionIDs(waiters)
			infos = append(infos, info)
			return nil
		})
	}
	err = classify(ctx, "list", err)
	s.metrics.Request(telemetry.OpList, start, err)
	if err != nil {
		return nil, err
	}
	return infos, nil
}

func sessionIDs(ss []string) []store.SessionID {
	ids := make([]store.SessionID, len(ss))
	for i, s := range ss {
		ids[i] = store.SessionID(s)
	}
	return ids
}

// prefixEnd returns the smallest string greater than every string that
// starts with prefix, in code point order (which is UTF-8 byte order, and so
// COLLATE "C" order), or false if there is none (empty prefix, or only
// U+10FFFF). The result is valid UTF-8, as PostgreSQL text must be.
func prefixEnd(prefix string) (string, bool) {
	runes := []rune(prefix)
	for i := len(runes) - 1; i >= 0; i-- {
		r := runes[i] + 1
		if r == 0xD800 { // skip the surrogates, which UTF-8 cannot encode
			r = 0xE000
		}
		if r <= unicode.MaxRune {
			runes[i] = r
			return string(runes[:i+1]), true
		}
	}
	return "", false
}
