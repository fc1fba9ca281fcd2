package store

import (
	"context"
	"crypto/rand"
	"time"
)

// SessionID identifies a session. It is opaque to every caller: at least 128
// random bits, never derived from a backend id such as an etcd lease id or a
// row id (C2 #ct2-spi).
type SessionID string

// NewSessionID returns a fresh random session id (26 base32 characters,
// 130 random bits). Backends use it so ids look the same everywhere.
func NewSessionID() SessionID { return SessionID(rand.Text()) }

// Session is what OpenSession returns.
type Session struct {
	ID SessionID
	// TTL is the TTL the backend actually applies; it may round the requested
	// TTL up (etcd leases have whole-second TTLs), never down.
	TTL time.Duration
	// Remaining is the deadline bound of C2 #ct2-deadline, measured from when
	// the store received the call.
	Remaining time.Duration
}

// HeartbeatBatcher is implemented by a SessionRegistry that renews several
// sessions in one backend round (C2 #ct2-heartbeat-many). Optional: a
// caller that finds none calls Heartbeat per session.
type HeartbeatBatcher interface {
	// HeartbeatMany is Heartbeat of every id, answered in order: lv[i]
	// and errs[i] are what Heartbeat(ctx, ids[i]) would have returned,
	// the renewals submitted to the backend together.
	HeartbeatMany(ctx context.Context, ids []SessionID) (lv []Liveness, errs []error)
}

// Liveness is what Heartbeat reports.
type Liveness struct {
	// Live is false once the session is known dead. Not-live is terminal: a
	// session once reported not-live is never reported live again.
	Live bool
	// Remaining is a conservative lower bound of how long the backend keeps
	// the session (and so its locks) alive, measured from when the store
	// received the call (C2 #ct2-deadline). Zero when not live.
	Remaining time.Duration
}

// Expiry is what ExpireSession reports.
type Expiry struct {
	// Ended is true when this call ended the session: the backend said it
	// had expired.
	Ended bool
	// Released is how many locks went with the session (Ended only).
	Released int
	// Remaining, when not Ended, is a lower bound of how long the backend
	// still keeps the session alive, measured from when the store received
	// the call: the earliest moment worth asking again.
	Remaining time.Duration
}

// Grant is one granted lock.
type Grant struct {
	Key     string
	Session SessionID
	// Token is the fencing token: strictly increasing over successive grants
	// of one key and never reused (C2 #ct2-fencing).
	Token uint64
	// AcquiredAt is the time of the grant on the backend's clock. It is for
	// display only and never used for a safety decision.
	AcquiredAt time.Time
	// Remaining is the holder session's deadline bound at grant time, as in
	// Liveness.Remaining. Zero where the grant is not a reply that extends
	// trust (LocksOf, Revoke).
	Remaining time.Duration
}

// LockInfo describes a held key: Inspect and List return it.
type LockInfo struct {
	Key        string
	Session    SessionID
	Token      uint64
	AcquiredAt time.Time
	// Owner and Labels are the holder session's (WithOwner); Value is the
	// grant's (SetValue). Empty when not set (C2 #ct2-holder).
	Owner  string
	Labels map[string]string
	Value  []byte
	// LockDelay is the held grant's lock-delay (SetGrantPolicy), zero if
	// none. DelayRemaining is set only by Inspect of a key nobody holds
	// (found false) that a lock-delay keeps from being granted: about how
	// long it still does (C2 #ct2-delay).
	LockDelay      time.Duration
	DelayRemaining time.Duration
	// Waiters are the sessions queued for the key, first in line first.
	Waiters []SessionID
	// Holders lists every holder of a semaphore or read/write key, lowest
	// token first; the single-holder fields above then describe the first
	// of them. Nil for a plain lock (C2 #ct2-multi).
	Holders []HolderInfo
	// Limit is the semaphore's N (1 for a read/write lock); 0 for a plain
	// lock. RW is true for a read/write lock.
	Limit uint32
	RW    bool
}

// EventKind says what happened to a key.
type EventKind int

// Event kinds (C2 #ct2-watch).
const (
	// EventAcquired: a session was granted the key.
	EventAcquired EventKind = iota + 1
	// EventReleased: the holder released the key (DeleteIfOwner).
	EventReleased
	// EventExpired: the holder's session ended (expired, lost or closed)
	// and took the grant with it.
	EventExpired
	// EventRevoked: an administrator revoked the grant.
	EventRevoked
	// EventValue: SetValue attached a value to the grant; the grant and its
	// token are unchanged. The event does not carry the value: a reader
	// inspects the key (C2 #ct2-watch, #ct2-holder).
	EventValue
	// EventMaxHold: the backend revoked a grant held past its maximum
	// hold (GrantPolicy.MaxHold, C2 #ct2-delay).
	EventMaxHold
	// EventResync: a resumed watch (WatchFrom) cannot tell what happened
	// since its cursor; the consumer re-reads the state (C2
	// #ct2-watch-resume). Only Cursor is set.
	EventResync
)

var eventKindNames = [...]string{"", "acquired", "released", "expired", "revoked", "value", "max_hold", "resync"}

func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventKindNames) {
		return eventKindNames[k]
	}
	return "unknown"
}

// Event is one change to a key, as WatchFrom reports it.
type Event struct {
	Kind    EventKind
	Key     string
	Session SessionID
	Token   uint64
	// Cursor is the opaque position right after this event, for
	// WatchFrom (C2 #ct2-watch-resume).
	Cursor string
	// Err is set only on the last value a watch channel delivers before it is
	// closed because the watch broke (not because its context ended). It is
	// classified like every other store error; the other fields are empty.
	Err error
}

// SessionRegistry opens, keeps and closes sessions (C2 #ct2-spi).
//
// All methods are safe for concurrent use. Every method that takes a context
// stops when it is cancelled and then returns an error for which
// errors.Is(err, ctx.Err()) holds, leaving no partial state behind.
type SessionRegistry interface {
	// OpenSession starts a session with the given TTL (store.ValidateTTL).
	// The backend frees every lock of a session that is neither heartbeated
	// (PostgreSQL) nor kept alive (etcd) for its TTL. WithSecretHash
	// records the owner's secret hash with it (C2 #ct2-ownership).
	OpenSession(ctx context.Context, ttl time.Duration, opts ...SessionOption) (Session, error)

	// SessionSecretHash returns the secret hash recorded when the session
	// was opened (nil if none), as long as the session exists, also when it
	// has expired but is not freed yet. ErrSessionDead when it is unknown
	// (C2 #ct2-ownership).
	SessionSecretHash(ctx context.Context, id SessionID) ([]byte, error)

	// SessionPrincipal returns the principal recorded with WithPrincipal
	// when the session was opened ("" if none), like SessionSecretHash.
	// ErrSessionDead when it is unknown (C2 #ct2-ownership).
	SessionPrincipal(ctx context.Context, id SessionID) (string, error)

	// Heartbeat reports the session's liveness and the deadline bound
	// (C2 #ct2-deadline). On backends that need it (PostgreSQL) it also
	// extends the session by its TTL; on etcd it only reports what the
	// session's keepalive stream knows. An unknown, expired or closed session
	// is reported as not live, with a nil error. A transient backend problem
	// is ErrContention or ErrNotLeader, never "not live".
	Heartbeat(ctx context.Context, id SessionID) (Liveness, error)

	// CloseSession ends the session unconditionally and releases every
	// lock it held, returning how many. It is for the session's own client
	// (or an operator); a replica whose client fell silent uses
	// ExpireSession. Idempotent: closing an unknown or already closed
	// session returns 0 and no error. Queued waiters of the session leave
	// their queues.
	CloseSession(ctx context.Context, id SessionID) (int, error)

	// ExpireSession ends the session only if the backend itself says it
	// has expired (C2 #ct2-replicas): what a replica calls once its client
	// fell silent past every Remaining it granted. Ended, it releases the
	// locks and queue places as CloseSession does. A session the backend
	// still keeps alive (another instance heartbeats it, or its expiry is
	// still to come) is left untouched: Expiry.Ended false, nil error. A
	// session already gone (unknown, collected, closed) is ErrSessionDead;
	// whoever ended it recorded its loss.
	ExpireSession(ctx context.Context, id SessionID) (Expiry, error)

	// LocksOf lists the session's grants, read from the backend (not a
	// cache), ordered by key. ErrSessionDead if the session is not live.
	LocksOf(ctx context.Context, id SessionID) ([]Grant, error)
}

// LockStore grants named locks inside sessions (C2 #ct2-spi).
//
// Every method is safe for concurrent use and follows the cancellation rule
// of SessionRegistry. Invalid input is ErrInvalidArgument and writes nothing.
// Every instance on the same backend and namespace can use every live
// session (C2 #ct2-replicas): one that does not know it adopts it from the
// backend.
type LockStore interface {
	SessionRegistry
	ValueSetter
	GrantPolicySetter

	// TryInsert grants key to the session iff the key is free, nobody is
	// queued for it, and the session is live. acquired is false (and err
	// nil) when another session holds the key or waiters are queued. If the
	// session already holds the key, its existing grant is returned with
	// acquired true, so a retried call is idempotent. An unknown or dead
	// session is ErrSessionDead and writes nothing. The options are
	// Acquire's.
	TryInsert(ctx context.Context, id SessionID, key string, opts ...AcquireOption) (g Grant, acquired bool, err error)

	// Acquire grants key to the session, waiting in the key's FIFO queue
	// (kept in the backend, shared by every store instance) until it is the
	// session's turn. It returns when granted; when ctx ends (the waiter
	// leaves the queue at once, unless KeepPlace; the error matches
	// ctx.Err()); or when the session dies (ErrSessionDead; the waiter
	// leaves the queue). If the session already holds the key, its existing
	// grant is returned at once. A session already queued for the key (a
	// place kept with KeepPlace, or a concurrent call) resumes that place
	// (C2 #ct2-keep-place). WithLimit and WithMode make the grant a
	// semaphore slot or a side of a read/write lock (C2 #ct2-multi); a
	// request of another kind than the key's holders and waiters is
	// ErrLimitMismatch.
	Acquire(ctx context.Context, id SessionID, key string, opts ...AcquireOption) (Grant, error)

	// AcquireAll grants the session every key of keys (plain exclusive
	// locks), or none (C2 #ct2-acquire-all): it returns one grant per key,
	// in the order of keys, with acquired true; or, when !wait and a key is
	// busy, nil, false and a nil error; or an error. Either way a call that
	// does not return every grant has released the grants it made before
	// it returns (keys the session held before are kept). Keys are taken
	// in ascending byte order, each waiting in its FIFO queue as Acquire
	// (wait) or with TryInsert's rule (!wait), so AcquireAll callers never
	// deadlock on each other. Invalid keys (store.ValidateKeys) are
	// ErrInvalidArgument; a semaphore or read/write key ErrLimitMismatch.
	// The one option is NoDeadlockCheck, applied to every key's wait; any
	// other is ErrInvalidArgument.
	AcquireAll(ctx context.Context, id SessionID, keys []string, wait bool, opts ...AcquireOption) (grants []Grant, acquired bool, err error)

	// LeaveQueue removes the session's place in the key's queue, if it has
	// one; it never touches a grant. Idempotent: a session that is not
	// queued for the key, or unknown, is nil (C2 #ct2-keep-place).
	LeaveQueue(ctx context.Context, id SessionID, key string) error

	// DeleteIfOwner releases the grant (session, key, token). It deletes the
	// key only if that exact grant is the current one: any other case
	// (wrong session, stale token, key free) is ErrNotOwner and changes
	// nothing, so a retried release never deletes a newer grant. A dead
	// session's grants are already gone: ErrNotOwner.
	DeleteIfOwner(ctx context.Context, id SessionID, key string, token uint64) error

	// Revoke deletes the key's current grant whoever holds it (an
	// administrative act that breaks the holder's trust; the fencing token
	// protects the resource). It returns the revoked grant, or found=false
	// if the key was free. The holder's session stays live.
	Revoke(ctx context.Context, key string) (g Grant, found bool, err error)

	// Inspect describes the key: found is false if nobody holds it.
	Inspect(ctx context.Context, key string) (info LockInfo, found bool, err error)

	// List returns held keys starting with prefix, in key order, beginning
	// after the key `after` ("" for the first page), at most limit of them
	// (store.ListLimit).
	List(ctx context.Context, prefix, after string, limit int) ([]LockInfo, error)

	// WatchFrom reports every change to keys starting with prefix, in
	// commit order, from right after the opaque cursor after ("": from now)
	// — a cursor any instance on the same backend and namespace returned
	// (C2 #ct2-watch, #ct2-watch-resume). It returns once the watch is
	// established, with the cursor of its start: every change committed
	// after it returns is delivered, and every event carries its Cursor.
	// The channel is closed when ctx ends, or after one final Event with Err
	// set when the watch breaks. SetValue is an EventValue of the grant it
	// set. A consumer that falls behind by more than the channel's buffer
	// breaks the watch (Err wraps ErrContention) rather than stalling the
	// backend. When the store cannot tell what happened after the cursor (no
	// history, history compacted, a cursor of another namespace or backend,
	// not a cursor) the first event is EventResync and the watch goes on
	// from now; a watch whose history is compacted while it runs does the
	// same, also one started from now. A resync is never an error: the
	// consumer re-reads the state it follows.
	WatchFrom(ctx context.Context, prefix, after string) (start string, events <-chan Event, err error)

	// SharesSessions reports whether every instance on the same backend and
	// namespace can use every live session (PostgreSQL: a session is a row;
	// etcd: a session record on the session's lease that any instance
	// adopts); true on both backends. A server over such a store cannot know
	// a session's grants from its own calls alone — a grant or revoke may go
	// through another replica — so it reads them from the store (LocksOf)
	// before every heartbeat answer that confirms locks (C2 #ct2-confirm).
	// Over a store that answers false the server trusts its own record of
	// the grants of a session it filled itself.
	SharesSessions() bool

	// ListSessions returns live sessions in id order, strictly after
	// q.After, at most q.Limit of them, filtered by q.Principal when
	// q.ByPrincipal (C2 #ct2-list-sessions). Invalid input (a bad After id,
	// a bad limit, an invalid principal) is ErrInvalidArgument.
	ListSessions(ctx context.Context, q SessionQuery) ([]SessionInfo, error)

	// Close stops every background goroutine of this instance and waits for
	// them. Sessions it opened are not closed: their locks are freed by the
	// backend's own expiry (docs/backends.md, restart semantics).
	Close() error
}
