package sessions

import (
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// State is where a record is in its life (doc.go, "States").
type State uint8

// The states of a record (doc.go).
const (
	Provisional State = iota
	Live
	Expiring
	Closing
	Draining
	Gone
)

var stateNames = [...]string{"Provisional", "Live", "Expiring", "Closing", "Draining", "Gone"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "State(?)"
}

// transitions is the table of allowed transitions of doc.go: from → to.
var transitions = map[State][]State{
	Provisional: {Live, Closing, Gone},
	Live:        {Expiring, Closing, Draining, Gone},
	Expiring:    {Live, Closing, Draining, Gone},
	Closing:     {Draining, Gone},
	Draining:    {Gone},
	Gone:        {},
}

// allowed reports whether from → to is in the table.
func allowed(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Record is the table's record of one session. Its fields are the table's:
// a handler holds a *Record only while it pins it, and reads or changes it
// only through Table methods.
type Record struct {
	id    store.SessionID
	state State
	// kept: the record stays in the table without pins until Gone (it was
	// opened here or adopted). A Provisional record, or one closed while
	// Provisional, is dropped once unpinned.
	kept bool
	// adopted: the session was not opened here; ttl is then learned from
	// heartbeat answers (a lower bound of the TTL), 0 until the first.
	adopted bool
	// seeded: locks is complete (opened here, or its grants were read
	// from the store after it was adopted).
	seeded bool
	// grantedAt is when this server answered each grant it tracked from
	// its own Grant (not seeded ones): the start of lockd_lock_hold_seconds
	// (C4 #ct4-template-stats). Its keys are a subset of locks'.
	grantedAt map[string]time.Time

	ttl time.Duration
	// reason is the session_lost reason of a silence close (set on the
	// move to Expiring; kept through Draining, so a retried close stays
	// an ExpireSession); empty for a close the client asked for.
	reason string
	// closeBy and closeRule are who asked for a close that the silence
	// loop retries (reason empty), for session_closed (C4 #ct4-audit);
	// closeCaller says they are set.
	closeBy, closeRule string
	closeCaller        bool
	// expiring is non-nil while the silence loop's close of the session is
	// in flight; it is closed once the outcome is recorded. A reply that
	// would extend trust waits for it (lockSettled).
	expiring chan struct{}
	// closeGen counts the silence closes begun: a call whose store answer
	// overlapped one extends nothing (CloseMark, lockSettled).
	closeGen      uint64
	closeAttempts int // failed silence-close attempts (backoff)
	// expireAt is the monotonic instant after which the client has been
	// silent long enough to be closed; expireGuess: it rests on
	// lock.session.max-ttl standing in for an adopted session's TTL not
	// learned yet.
	expireAt    time.Time
	expireGuess bool
	// heapAt is where the record sits in the silence heap: never later
	// than expireAt. An extension of expireAt leaves it in place; the
	// silence loop files the record again when heapAt comes.
	heapAt  time.Time
	heapIdx int // index in Table.silence, -1 when not in it
	pins    int // RPCs in flight that use this record
	// trustUntil is the latest (receipt + Remaining) this server granted:
	// the client trusts nothing of the session beyond it.
	trustUntil time.Time

	// stream is the KeepAlive stream the latest heartbeat came on.
	stream *Stream
	// locks are the session's grants as this server knows them, key →
	// token. Lock-lost notices are routed by them and heartbeat answers
	// confirm exactly them (C2 #ct2-confirm).
	locks map[string]uint64
	// reading counts grants and seeding reads in flight: while positive,
	// goneTok remembers, per key, the highest token gone (released,
	// revoked, lost), so a grant or read that raced with the loss is not
	// tracked afterwards. Cleared when reading drops to 0.
	reading      int
	goneTok      map[string]uint64
	goneOverflow bool
	// notices are the lock-lost notices the client has not acknowledged,
	// oldest first.
	notices []*lockdv1.LockLost

	// secretHash is the SHA-256 of the session's secret, nil when not
	// known yet; principal the principal it is bound to ("" for none),
	// valid when principalKnown. Neither ever changes for a session.
	secretHash     []byte
	principal      string
	principalKnown bool
}

// ID is the session's id.
func (r *Record) ID() store.SessionID { return r.id }

func newRecord(id store.SessionID) *Record {
	return &Record{id: id, heapIdx: -1, locks: map[string]uint64{}}
}

// move changes r's state to `to` if the table of doc.go allows it (t.mu
// held); a move to the same state is no move. It is the one place a state
// changes. An unlisted move is refused and counted (badMoves, which the
// tests check is zero): the record keeps its state.
func (t *Table) move(r *Record, to State) bool {
	if r.state == to {
		return true
	}
	if !allowed(r.state, to) {
		t.badMoves++
		return false
	}
	r.state = to
	return true
}

// mayExtend reports whether a reply may extend trust in r (t.mu held).
func (t *Table) mayExtend(r *Record) bool {
	return (r.state == Provisional || r.state == Live) && !t.closingAll
}

// endingLocked reports whether r is being ended for good (t.mu held): the
// store said it is gone, its client or an operator closed it, or a
// shutdown closes every session. A silence close (Expiring) is not final
// here: only the backend ends a session a client fell silent on
// (ExpireSession, C2 #ct2-replicas), and a call that reaches this server
// shows its client is not silent here any more (revive).
func (t *Table) endingLocked(r *Record) bool {
	switch r.state {
	case Closing, Draining, Gone:
		return true
	}
	return t.closingAll
}
