package pgstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// Semaphores and read/write locks (C2 #ct2-multi, migrations 0006 and
// 0008). A key of either kind has one slots row per holder and its queue in
// slot_waiters. An attempt is one statement, slot_attempt: it takes the
// key's advisory lock (the one keyLock takes, as every plain grant does),
// looks at the session, the key's plain rows, its slots and its queue, and
// decides as store.Admit does (slot_verdict): grant (a slots row whose
// token is drawn in the INSERT, under the key lock: strictly increasing per
// key over both kinds, see grant), queue, or ErrLimitMismatch. The plain
// grant paths refuse a key with slots or slot waiters (grantCheck,
// grantBatch), so a key is never held both ways. Slots cascade from their
// session; their deletes notify like lock deletes. A change made under the
// key's lock (slot_attempt's grant, queueing or dequeue; slot_release)
// wakes only the waiters the key's holders now admit, named by the slot
// triggers (slot_admissible); any other (a session's end, a revoke, a
// waiter leaving on a timeout) wakes every local waiter of the key, which
// decide again. A release (slot_release, migration 0010) grants the
// waiters it admits in its own statement (C2 #ct2-multi, hand-over in the
// release): the woken waiters find their slots held. pgstore.TestSlotAdmissibleMatchesAdmit holds the SQL to
// store.Admit.

// multiQueries are the statements of multi.go.
type multiQueries struct {
	attempt                   string
	dequeue                   string
	release, revoke, setValue string
	inspect, list             string
}

func newMultiQueries(r *strings.Replacer) multiQueries {
	const info = `SELECT m.key, m.session_id, m.token, m.mode, m.lim, m.acquired_at,
		coalesce(s.owner, ''), coalesce(s.labels, '{}'::jsonb), m.value,
		ARRAY(SELECT w.session_id FROM {{s}}.slot_waiters w WHERE w.key = m.key ORDER BY w.id)
		FROM {{s}}.slots m LEFT JOIN {{s}}.sessions s ON s.id = m.session_id`
	return multiQueries{
		// One attempt (attemptMulti) in one statement, under the key's
		// advisory lock (the one keyLock takes, its hash computed here).
		// $6: the caller's store.NoDeadlockCheck, stored with its place
		// (migration 0014).
		attempt: r.Replace(`SELECT * FROM {{s}}.slot_attempt(hashtextextended({{keylock}} || $1::text, 0), $1, $2, $3, $4, $5, $6)`),
		dequeue: r.Replace(`DELETE FROM {{s}}.slot_waiters WHERE key = $1 AND session_id = $2`),
		// Release (releaseSlot) in one statement, under the same lock;
		// NULL: not the current grant.
		release: r.Replace(`SELECT {{s}}.slot_release(hashtextextended({{keylock}} || $1::text, 0), $1, $2, $3)`),
		revoke: r.Replace(`DELETE FROM {{s}}.slots
			WHERE key = $1 AND set_config('lockd.reason', 'revoked', true) IS NOT NULL
			RETURNING session_id, token, acquired_at`),
		setValue: r.Replace(`UPDATE {{s}}.slots SET value = $4
			WHERE key = $1 AND session_id = $2 AND token = $3
			AND EXISTS (SELECT 1 FROM {{s}}.sessions WHERE id = $2 AND expires_at > now())`),
		inspect: r.Replace(info + ` WHERE m.key = $1 ORDER BY m.token`),
		// $1 prefix, $2 the first string past every key with the prefix
		// (NULL: none), $3 after, $4 limit: as list.
		list: r.Replace(`WITH k AS (SELECT DISTINCT key FROM {{s}}.slots
				WHERE key >= $1::text COLLATE "C" AND ($2::text IS NULL OR key < $2::text COLLATE "C")
				AND key > $3::text COLLATE "C" ORDER BY key LIMIT $4)
			` + info + ` JOIN k ON k.key = m.key ORDER BY m.key, m.token`),
	}
}

func errMismatch(key string, o store.AcquireOptions) error {
	kind := "a plain lock"
	switch {
	case o.RW():
		kind = "a read/write lock (" + o.Mode.String() + ")"
	case o.Limit > 1:
		kind = "a semaphore of " + strconv.FormatUint(uint64(o.Limit), 10)
	}
	return fmt.Errorf("%w: key %q is held or awaited as another kind of lock than %s", store.ErrLimitMismatch, key, kind)
}

// attemptMulti is one attempt of a slot: granted, held, busy (queued when
// wait), dead or mismatch. It is one statement, slot_attempt (migration
// 0008), which decides under the key's lock as store.Admit does; it is
// observed as one request. A caller whose ctx ends while the statement
// runs may have been granted all the same (PostgreSQL cancels the
// statement or finishes it first): the grant is its session's, which the
// SDK releases when no call claims it (C2 #ct2-keep-place), as on etcd.
func (s *Store) attemptMulti(ctx context.Context, id store.SessionID, key string, o store.AcquireOptions, wait bool) (g store.Grant, out outcome, err error) {
	op := telemetry.OpTryInsert
	if wait {
		op = telemetry.OpAcquire
	}
	defer s.metrics.Observe(op)(&err)
	var (
		code        int16
		tok, remain *int64
		at          *time.Time
	)
	err = s.pool.QueryRow(ctx, s.q.m.attempt, key, string(id), int16(o.Mode), int32(o.Limit), wait, o.NoDeadlockCheck).Scan(&code, &tok, &at, &remain)
	if err != nil {
		return store.Grant{}, 0, classify(ctx, "acquire", err)
	}
	out = outcome(code)
	if out == granted || out == held {
		g = store.Grant{Key: key, Session: id, Token: uint64(*tok), AcquiredAt: *at, Remaining: time.Duration(*remain) * time.Microsecond}
	}
	return g, out, nil
}

// tryMulti is TryInsert of a slot.
func (s *Store) tryMulti(ctx context.Context, id store.SessionID, key string, o store.AcquireOptions) (store.Grant, bool, error) {
	g, out, err := s.attemptMulti(ctx, id, key, o, false)
	switch {
	case err != nil:
		return store.Grant{}, false, s.acquireFailed(ctx, err)
	case out == granted:
		s.newGrant(g, 0)
		return g, true, nil
	case out == held:
		s.metrics.Acquire(telemetry.AcquireGranted, 0)
		return g, true, nil
	case out == busy:
		s.metrics.Acquire(telemetry.AcquireContended, 0)
		return store.Grant{}, false, nil
	case out == mismatch:
		return store.Grant{}, false, s.acquireFailed(ctx, fmt.Errorf("pgstore: try insert: %w", errMismatch(key, o)))
	}
	return store.Grant{}, false, s.acquireFailed(ctx, fmt.Errorf("pgstore: try insert: %w", store.ErrSessionDead))
}

// acquireMulti is Acquire of a slot: attempts, woken by the notifications
// of the key (as Acquire), until granted. A release hands its freed slot to
// the waiters it admits in its own statement (slot_release, migration
// 0010): such a waiter's next attempt finds the slot held.
func (s *Store) acquireMulti(ctx context.Context, id store.SessionID, key string, o store.AcquireOptions) (store.Grant, error) {
	w, err := s.addWaiter(id, key)
	if err != nil {
		return store.Grant{}, s.acquireFailed(ctx, err)
	}
	defer s.removeWaiter(w)
	g, wsp, err := s.multiLoop(ctx, id, key, o, w)
	wsp.EndWait(ctx, err) // the wait's span, if it waited traced (C4 #ct4-traces)
	return g, err
}

// multiLoop is acquireMulti's attempts and waits, and the wait's span once
// an attempt was not admitted (nil when untraced), as acquireLoop.
func (s *Store) multiLoop(ctx context.Context, id store.SessionID, key string, o store.AcquireOptions, w *waiter) (store.Grant, *telemetry.Span, error) {
	var wsp *telemetry.Span
	var refused <-chan struct{} // closed when the detector refuses this wait (C2 #ct2-deadlock)
	var refusal func() *store.DeadlockError
	start := time.Now()
	recheck := time.NewTimer(s.recheck)
	defer recheck.Stop()
	for queued := false; ; queued = true {
		g, out, err := s.attemptMulti(ctx, id, key, o, true)
		if err != nil {
			s.leaveSlotQueue(id, key)
			return store.Grant{}, wsp, s.acquireFailed(ctx, err)
		}
		if out == held && queued {
			// Handed over by a release (slot_release, migration 0010):
			// a new grant of this call, not one held before it.
			out = granted
		}
		if done, g, err := s.acquireDone(ctx, out, g, key, o, start, false); done {
			return g, wsp, err
		}
		if !queued {
			// The first attempt not admitted: the wait's span from now;
			// later attempts are its children.
			ctx, wsp = telemetry.StartWait(ctx, "pg")
		}
		if refused == nil && !o.NoDeadlockCheck {
			// Queued from now: the detector may refuse it (registered only
			// now, so a grant at the first attempt costs nothing).
			dw := s.deadlocks.Register(id, key, nil)
			defer dw.Done()
			refused, refusal = dw.Refused(), dw.Err
		}
		recheck.Reset(s.recheck)
		select {
		case <-w.wake:
		case <-recheck.C:
		case <-refused:
			// The victim of a deadlocked set (C2 #ct2-deadlock): the place
			// goes. A grant the last attempt got was returned above; a slot
			// a release handed over meanwhile stays the session's, released
			// by the SDK as unclaimed (C2 #ct2-keep-place), as after a
			// timeout.
			s.leaveSlotQueue(id, key)
			return store.Grant{}, wsp, s.acquireFailed(ctx, fmt.Errorf("pgstore: acquire: %w", refusal()))
		case <-ctx.Done():
			s.leaveSlotQueue(id, key)
			return store.Grant{}, wsp, s.acquireFailed(ctx, fmt.Errorf("pgstore: acquire: %w", ctx.Err()))
		case <-s.closing:
			s.leaveSlotQueue(id, key)
			return store.Grant{}, wsp, s.acquireFailed(ctx, fmt.Errorf("pgstore: acquire: %w", errClosed))
		}
	}
}

// leaveSlotQueue removes the session's slot waiter row of key, best
// effort (as leaveQueue).
func (s *Store) leaveSlotQueue(id store.SessionID, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_, _ = s.pool.Exec(ctx, s.q.m.dequeue, key, string(id))
}

// releaseSlot is DeleteIfOwner of a slot (the plain release found no
// such lock row).
func (s *Store) releaseSlot(ctx context.Context, id store.SessionID, key string, token uint64) error {
	// slot_release (migrations 0008, 0010) deletes under the key's lock
	// and grants the waiters the release admits in the same statement
	// (C2 #ct2-multi, hand-over in the release); its events wake them.
	var at *time.Time
	err := s.pool.QueryRow(ctx, s.q.m.release, key, string(id), int64(token)).Scan(&at)
	if err = classify(ctx, "release", err); err != nil {
		return err
	}
	if at == nil {
		return fmt.Errorf("pgstore: release: %w", store.ErrNotOwner)
	}
	s.log.LockReleased(store.Grant{Key: key, Session: id, Token: token, AcquiredAt: *at}, telemetry.ReleaseRelease)
	s.metrics.Released(telemetry.ReleaseRelease, 1)
	return nil
}

// revokeSlots is Revoke of a semaphore or read/write key: every slot goes
// in one statement; the lowest token is returned.
func (s *Store) revokeSlots(ctx context.Context, key string) (store.Grant, bool, error) {
	var gs []store.Grant
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		gs = gs[:0]
		rows, _ := tx.Query(ctx, s.q.m.revoke, key)
		var sid string
		var tok int64
		var at time.Time
		_, err := pgx.ForEachRow(rows, []any{&sid, &tok, &at}, func() error {
			gs = append(gs, store.Grant{Key: key, Session: store.SessionID(sid), Token: uint64(tok), AcquiredAt: at})
			return nil
		})
		return err
	})
	if err = classify(ctx, "revoke", err); err != nil {
		return store.Grant{}, false, err
	}
	if len(gs) == 0 {
		return store.Grant{}, false, nil
	}
	slices.SortFunc(gs, func(a, b store.Grant) int { return int(int64(a.Token) - int64(b.Token)) })
	for _, g := range gs {
		s.log.LockRevoked(ctx, key, g.Token)
		s.log.LockReleased(g, telemetry.ReleaseRevoked)
	}
	s.metrics.Released(telemetry.ReleaseRevoked, len(gs))
	return gs[0], true, nil
}

// setSlotValue is SetValue of a slot (the plain update found no such lock
// row).
func (s *Store) setSlotValue(ctx context.Context, id store.SessionID, key string, token uint64, value []byte) error {
	tag, err := s.pool.Exec(ctx, s.q.m.setValue, key, string(id), int64(token), value)
	if err = classify(ctx, "set value", err); err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("pgstore: set value: %w", store.ErrNotOwner)
	}
	return nil
}

// scanSlotInfos reads rows of the info statements into one LockInfo per
// key, in row order.
func scanSlotInfos(rows pgx.Rows) ([]store.LockInfo, error) {
	var infos []store.LockInfo
	var (
		key, sid      string
		tok           int64
		mode          int16
		lim           int32
		at            time.Time
		owner         string
		labels, value []byte
		waiters       []string
	)
	_, err := pgx.ForEachRow(rows, []any{&key, &sid, &tok, &mode, &lim, &at, &owner, &labels, &value, &waiters}, func() error {
		if len(infos) == 0 || infos[len(infos)-1].Key != key {
			infos = append(infos, store.LockInfo{Key: key, Limit: uint32(lim), RW: mode != int16(store.ModeUnset), Waiters: sessionIDs(waiters)})
		}
		in := &infos[len(infos)-1]
		in.Holders = append(in.Holders, store.HolderInfo{Session: store.SessionID(sid), Token: uint64(tok), Mode: store.Mode(mode),
			AcquiredAt: at, Owner: owner, Labels: decodeLabels(labels), Value: cloneValue(value)})
		return nil
	})
	for i := range infos {
		h := infos[i].Holders[0]
		infos[i].Session, infos[i].Token, infos[i].AcquiredAt = h.Session, h.Token, h.AcquiredAt
		infos[i].Owner, infos[i].Labels, infos[i].Value = h.Owner, h.Labels, h.Value
	}
	return infos, err
}

// inspectSlots is Inspect of a key without a plain grant.
func (s *Store) inspectSlots(ctx context.Context, key string) (store.LockInfo, bool, error) {
	rows, _ := s.pool.Query(ctx, s.q.m.inspect, key)
	infos, err := scanSlotInfos(rows)
	if err = classify(ctx, "inspect", err); err != nil {
		return store.LockInfo{}, false, err
	}
	if len(infos) == 0 {
		return store.LockInfo{}, false, nil
	}
	return infos[0], true, nil
}

// mergeSlots adds the semaphore and read/write keys of List's page to its
// plain keys, in key order, at most limit in all.
func (s *Store) mergeSlots(ctx context.Context, plain []store.LockInfo, prefix string, end *string, after string, limit int) ([]store.LockInfo, error) {
	rows, _ := s.pool.Query(ctx, s.q.m.list, prefix, end, after, limit)
	multi, err := scanSlotInfos(rows)
	if err = classify(ctx, "list", err); err != nil {
		return nil, err
	}
	if len(multi) == 0 {
		return plain, nil
	}
	out := append(plain, multi...)
	slices.SortFunc(out, func(a, b store.LockInfo) int { return strings.Compare(a.Key, b.Key) })
	out = slices.CompactFunc(out, func(a, b store.LockInfo) bool { return a.Key == b.Key })
	return out[:min(len(out), limit)], nil
}
