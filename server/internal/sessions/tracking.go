package sessions

import (
	"context"
	"log/slog"
	"maps"
	"time"

	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// Seed fills the record of a session this server did not open (adopted:
// PostgreSQL sessions are usable from any replica and survive a lockd
// restart) with its grants read from the store, once, so that answers can
// confirm them. Over a store whose sessions every replica can use
// (Config.SharedSessions) it reads them again before every answer: a grant
// or revoke through another replica changes them without this server
// seeing it, so its own record would list a revoked lock, or miss a lock
// granted elsewhere (C2 #ct2-confirm). A grant tracked before the read
// began that the store no longer has went away through another replica.
func (t *Table) Seed(ctx context.Context, r *Record) error {
	t.mu.Lock()
	if r.locks == nil || (r.seeded && !t.cfg.SharedSessions) {
		t.mu.Unlock()
		return nil
	}
	before := maps.Clone(r.locks)
	r.reading++
	t.mu.Unlock()
	grants, err := t.be.LocksOf(ctx, r.id)
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.endReadLocked(r)
	if err != nil || r.locks == nil {
		return err
	}
	inStore := make(map[string]uint64, len(grants))
	for _, g := range grants {
		inStore[g.Key] = g.Token
	}
	for k, tok := range before {
		if inStore[k] != tok && r.locks[k] == tok {
			t.goneLocked(r, k, tok)
		}
	}
	for _, g := range grants {
		t.trackLocked(r, g.Key, g.Token)
	}
	r.seeded = true
	return nil
}

// endReadLocked ends a grant or seeding read (t.mu held).
func (t *Table) endReadLocked(r *Record) {
	r.reading--
	if r.reading <= 0 {
		r.reading = 0
		r.goneTok, r.goneOverflow = nil, false
	}
}

// trackLocked records a grant of r (t.mu held), unless a grant of the key
// with this token or a later one went away while it was in flight: a late
// grant reply or store read never revives a lost grant. It reports whether
// the grant is tracked.
func (t *Table) trackLocked(r *Record, key string, token uint64) bool {
	if r.locks == nil || r.goneOverflow || token <= r.goneTok[key] {
		return false
	}
	if tok, ok := r.locks[key]; ok && tok > token {
		return false // a newer grant of the key is tracked
	}
	if r.locks[key] != token {
		t.endedLocked(r, key) // an older grant ended
	}
	r.locks[key] = token
	return true
}

// goneLocked records that (key, token) of r went away and forgets it if
// tracked (t.mu held). It returns the tracked token that went (at most
// token: a session holds one grant of a key at a time, and tokens of a key
// only rise, so an older tracked grant is gone too) and whether there was
// one.
func (t *Table) goneLocked(r *Record, key string, token uint64) (uint64, bool) {
	if r.reading > 0 && token > r.goneTok[key] {
		if r.goneTok == nil {
			r.goneTok = map[string]uint64{}
		}
		if len(r.goneTok) >= maxGoneKeys {
			r.goneOverflow = true
		} else {
			r.goneTok[key] = token
		}
	}
	tok, ok := r.locks[key]
	if !ok || tok > token {
		return 0, false
	}
	delete(r.locks, key)
	t.endedLocked(r, key)
	return tok, true
}

// endedLocked tells Config.Ended that r's grant of key this table
// answered ended, and forgets its answer time (t.mu held).
func (t *Table) endedLocked(r *Record, key string) {
	at, ok := r.grantedAt[key]
	if !ok {
		return
	}
	delete(r.grantedAt, key)
	if t.cfg.Ended != nil {
		t.cfg.Ended(key, t.now().Sub(at))
	}
}

// HeldFor is how long session id has held key by the table's clock, from
// this table's first answer of the grant; false when the table did not
// answer it (adopted, another replica's) or the grant ended.
func (t *Table) HeldFor(id store.SessionID, key string) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.recs[id]
	if r == nil {
		return 0, false
	}
	at, ok := r.grantedAt[key]
	if !ok {
		return 0, false
	}
	return t.now().Sub(at), true
}

// endAllLocked ends every grant of r this table answered (t.mu held): its
// session is gone.
func (t *Table) endAllLocked(r *Record) {
	for key := range r.grantedAt {
		t.endedLocked(r, key)
	}
	r.grantedAt = nil
}

// Untrack forgets a grant released through any instance.
func (t *Table) Untrack(id store.SessionID, key string, token uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.recs[id]; r != nil {
		t.goneLocked(r, key, token)
	}
}

// heldLocked is the session's held set for a heartbeat answer (t.mu held):
// nil when the table does not know all its grants.
func heldLocked(r *Record) *lockdv1.HeldLocks {
	if !r.seeded || r.locks == nil {
		return nil
	}
	h := &lockdv1.HeldLocks{Locks: make([]*lockdv1.HeldLock, 0, len(r.locks))}
	for k, tok := range r.locks {
		h.Locks = append(h.Locks, &lockdv1.HeldLock{Key: k, Token: tok})
	}
	return h
}

// LockLost tells the holder session that it lost (key, token): the grant
// is forgotten and a notice queued and pushed, once.
func (t *Table) LockLost(id store.SessionID, key string, token uint64, reason lockdv1.LockLostReason) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.recs[id]
	if r == nil {
		return
	}
	tok, ok := t.goneLocked(r, key, token)
	if !ok {
		return
	}
	if tok != token {
		reason = lockdv1.LockLostReason_LOCK_LOST_REASON_UNSPECIFIED
	}
	t.noticeLocked(r, key, tok, reason)
}

// noticeLocked queues a lock-lost notice for r until the client
// acknowledges it, and pushes it on the session's stream at once (t.mu
// held). Every heartbeat answer repeats the unacknowledged notices, so a
// push lost on the way is delivered with the next answer.
func (t *Table) noticeLocked(r *Record, key string, token uint64, reason lockdv1.LockLostReason) {
	t.noticeSeq++
	notice := &lockdv1.LockLost{Key: key, Token: token, Reason: reason, NoticeId: t.noticeSeq}
	r.notices = append(r.notices, notice)
	if over := len(r.notices) - maxPendingNotices; over > 0 {
		r.notices = r.notices[over:]
		t.log.LogAttrs(context.Background(), slog.LevelWarn, telemetry.EventNoticesDropped, slog.Int("dropped", over))
	}
	// A silence close the backend may still refuse is not an end
	// (endingLocked): a push never extends trust, so live is safe to say.
	live := reason != lockdv1.LockLostReason_LOCK_LOST_REASON_EXPIRED && r.state != Gone &&
		(r.state == Draining || !t.endingLocked(r))
	if r.stream != nil {
		r.stream.push(&lockdv1.KeepAliveResponse{SessionId: string(r.id), Live: live,
			Lost: []*lockdv1.LockLost{notice}})
	}
}

// ackLocked drops the notices of r the client acknowledged (t.mu held) and
// wakes a draining CloseAll.
func (t *Table) ackLocked(r *Record, ids []uint64) {
	if len(ids) == 0 || len(r.notices) == 0 {
		return
	}
	acked := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		acked[id] = true
	}
	kept := r.notices[:0]
	for _, n := range r.notices {
		if !acked[n.NoticeId] {
			kept = append(kept, n)
		}
	}
	clear(r.notices[len(kept):])
	r.notices = kept
	if t.drainWake != nil {
		select {
		case t.drainWake <- struct{}{}:
		default:
		}
	}
}

// pendingLocked returns a copy of the unacknowledged notices of r (t.mu
// held).
func pendingLocked(r *Record) []*lockdv1.LockLost {
	if len(r.notices) == 0 {
		return nil
	}
	return append([]*lockdv1.LockLost(nil), r.notices...)
}

// Tracked is one session's grants as the table knows them (a copy).
type Tracked struct {
	ID    store.SessionID
	Locks map[string]uint64
}

// TrackedLocks returns a copy of the grants of every session not Gone that
// has some: what the server reconciles against the store after its
// lock-loss watch was (re-)established.
func (t *Table) TrackedLocks() []Tracked {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Tracked
	for id, r := range t.recs {
		if len(r.locks) > 0 && r.state != Gone {
			out = append(out, Tracked{ID: id, Locks: maps.Clone(r.locks)})
		}
	}
	return out
}

// Holder is one session that holds a key, with its token.
type Holder struct {
	ID    store.SessionID
	Token uint64
}

// HoldersOf returns the sessions not Gone that hold key as the table knows.
func (t *Table) HoldersOf(key string) []Holder {
	t.mu.Lock()
	defer t.mu.Unlock()
	var hs []Holder
	for id, r := range t.recs {
		if tok, ok := r.locks[key]; ok && r.state != Gone {
			hs = append(hs, Holder{id, tok})
		}
	}
	return hs
}
