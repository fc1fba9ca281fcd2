package sessions

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"lock.dev/lockd/store"
)

// Backend is what the table asks of the store: the silence loop's and the
// shutdown's closes, and the grants of a session (seeding, Seed). A
// store.LockStore is one.
type Backend interface {
	// ExpireSession ends the session only if the backend says it expired
	// (C2 #ct2-replicas).
	ExpireSession(ctx context.Context, id store.SessionID) (store.Expiry, error)
	// CloseSession ends the session unconditionally.
	CloseSession(ctx context.Context, id store.SessionID) (int, error)
	// LocksOf lists the session's grants, read from the backend.
	LocksOf(ctx context.Context, id store.SessionID) ([]store.Grant, error)
}

// Config is what the table needs of the server's configuration.
type Config struct {
	// MaxTTL (lock.session.max-ttl) stands in for an adopted session's
	// TTL until a heartbeat answer taught it.
	MaxTTL time.Duration
	// The limits the table counts (C5 #ct5-limits): sessions kept,
	// OpenSession calls in progress, keys per session, sessions per
	// KeepAlive stream.
	MaxSessions, MaxSessionOpens, MaxLocksPerSession, MaxSessionsPerStream int
	// SharedSessions: every replica can use every session of the store,
	// so a heartbeat answer reads the session's grants again (Seed).
	SharedSessions bool
	// Log receives the table's operational warnings; nil discards them.
	Log *slog.Logger
	// Lost is told of a session this server's silence close ended
	// (session_lost, C4), once; nil tells nobody.
	Lost func(id store.SessionID, reason string)
	// Ended is told of every grant this table answered (Grant), once,
	// when it ends, however it ends: released, lost or revoked (Untrack,
	// LockLost, Seed), replaced by a later grant of the key, its session
	// gone, the server's drain. held runs from the grant's first answer
	// on the table's clock (C4 #ct4-template-stats). Called with the
	// table's lock held: it must not call the table. nil tells nobody.
	Ended func(key string, held time.Duration)
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Silence-close timing: the backoff between attempts to close a silent
// session when the backend refuses, the bound of one attempt, and how far
// before the backend's expiry a refused close is filed again.
const (
	closeRetryMin = 200 * time.Millisecond
	closeRetryMax = 5 * time.Second
	// CloseTimeout bounds one close or store read of the table, and what
	// the server's own background reads use.
	CloseTimeout = 10 * time.Second
	// expireEarly: a silent session is filed again this much before its
	// backend expiry, so the store can wait for the expiry itself (pgstore
	// waits up to 50 ms) and end the session before the reaper does.
	expireEarly = 25 * time.Millisecond
	// refileAhead is how far ahead of their heapAt the silence loop files
	// extended records again, so that one wake-up refiles a second's
	// worth of them instead of waking once per record.
	refileAhead = time.Second
)

// maxPendingNotices bounds the unacknowledged lock-lost notices kept for a
// session (the oldest are dropped; the held set still ends the client's
// trust in those locks, C2 #ct2-confirm).
const maxPendingNotices = 1024

// maxGoneKeys bounds the per-session memory of grants gone while a grant or
// a seeding read is in flight (goneTok); beyond it every such grant is
// refused tracking, which only makes its client drop the lock.
const maxGoneKeys = 4096

// ErrCloseOverlap answers a call whose store answer overlapped a silence
// close of its session on this replica (C2 #ct2-replicas): retryable, it
// extends nothing; the retry adopts the session again.
var ErrCloseOverlap = fmt.Errorf("%w: the session's silence close on this replica overlapped the call; retry", store.ErrContention)

// ErrStreamFull refuses a session on a KeepAlive stream that carries
// MaxSessionsPerStream sessions.
var ErrStreamFull = errors.New("sessions: the keepalive stream carries its maximum of sessions")

// Table is the server's session table (doc.go). Its methods are safe for
// concurrent use.
type Table struct {
	cfg Config
	be  Backend
	log *slog.Logger
	now func() time.Time

	// ctx ends at Close; the silence loop and its closes watch it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu         sync.Mutex
	recs       map[store.SessionID]*Record
	silence    silenceHeap
	wake       chan struct{}
	closingAll bool // CloseAll began
	badMoves   int  // refused moves (move): a bug; the tests check it stays 0

	opens int // OpenSession calls past admission and not yet registered
	// byPrincipal counts the records of each known principal (anonymous
	// is ""), opensBy its OpenSession calls counted in opens
	// (#ct5-principal-limits); no entry for 0.
	byPrincipal, opensBy map[string]int
	acquiring            map[store.SessionID]int // Acquire calls in progress, per session

	noticeSeq uint64        // the last lock-lost notice id
	drainWake chan struct{} // set by CloseAll: an acknowledgement arrived

	draining    atomic.Bool          // set when Drain begins; never cleared
	streams     map[*Stream]struct{} // open KeepAlive streams
	streamsGone chan struct{}        // capacity 1: a KeepAlive stream ended
}

// New returns a table and starts its silence loop; Close stops it.
func New(cfg Config, be Backend) *Table {
	t := newTable(cfg, be)
	t.wg.Add(1)
	go t.silenceLoop() // exits when t.ctx ends (Close)
	return t
}

// newTable returns a table whose silence loop is not running (the unit
// tests drive sweep and closeSilent themselves).
func newTable(cfg Config, be Backend) *Table {
	t := &Table{
		cfg:         cfg,
		be:          be,
		log:         cfg.Log,
		now:         cfg.Now,
		recs:        map[store.SessionID]*Record{},
		wake:        make(chan struct{}, 1),
		acquiring:   map[store.SessionID]int{},
		byPrincipal: map[string]int{},
		opensBy:     map[string]int{},
		streams:     map[*Stream]struct{}{},
		streamsGone: make(chan struct{}, 1),
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if t.now == nil {
		t.now = time.Now
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t
}

// Close stops the silence loop, ends its close in flight, and waits for
// it. Calling it again does nothing more.
func (t *Table) Close() {
	t.cancel()
	t.wg.Wait()
}

// Len is the number of records in the table.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.recs)
}

// Open records a session just opened here (recv: when OpenSession was
// received), bound to principal, and reports false — recording nothing —
// once CloseAll began (the caller closes the session it opened).
func (t *Table) Open(sess store.Session, recv time.Time, secretHash []byte, principal string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closingAll {
		return false
	}
	r := newRecord(sess.ID)
	r.state, r.kept, r.seeded, r.ttl, r.secretHash = Live, true, true, sess.TTL, secretHash
	t.setPrincipalLocked(r, principal)
	r.expireAt, r.trustUntil = recv.Add(max(sess.TTL, sess.Remaining)), recv.Add(sess.Remaining)
	t.recs[sess.ID] = r
	t.schedule(r)
	return true
}

// Pin returns the record of id, creating a Provisional one, and keeps it
// from being dropped until Unpin.
func (t *Table) Pin(id store.SessionID) *Record {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pinLocked(id)
}

func (t *Table) pinLocked(id store.SessionID) *Record {
	r := t.recs[id]
	if r == nil {
		r = newRecord(id)
		t.recs[id] = r
	}
	r.pins++
	return r
}

// PinUse is Pin for a request that may grant a lock: it also reports
// whether the session is ending, under the same lock, and begins a read
// (a grant that goes meanwhile is not tracked) that the caller ends with
// EndRead.
func (t *Table) PinUse(id store.SessionID) (r *Record, ending bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r = t.pinLocked(id)
	r.reading++
	return r, t.endingLocked(r)
}

// EndRead ends the read PinUse began.
func (t *Table) EndRead(r *Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.endReadLocked(r)
}

// Unpin releases a pin; an unpinned record that is not kept, or Gone, is
// dropped.
func (t *Table) Unpin(r *Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r.pins--
	t.dropIfDone(r)
}

// dropIfDone removes r from the table when nothing needs it (t.mu held).
func (t *Table) dropIfDone(r *Record) {
	if r.pins > 0 || (r.kept && r.state != Gone) {
		return
	}
	t.unschedule(r)
	if r.stream != nil {
		r.stream.sessions--
		r.stream = nil
	}
	if t.recs[r.id] == r {
		delete(t.recs, r.id)
		t.forgetPrincipalLocked(r)
	}
	r.locks = nil
	t.endAllLocked(r)
	r.notices = nil
	r.goneTok = nil
}

// Ending reports whether r is being ended for good (endingLocked).
func (t *Table) Ending(r *Record) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.endingLocked(r)
}

// StateOf is r's state.
func (t *Table) StateOf(r *Record) State {
	t.mu.Lock()
	defer t.mu.Unlock()
	return r.state
}

// Seeded reports whether r's grants are known in full.
func (t *Table) Seeded(r *Record) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return r.seeded
}

// MarkGone records that the store reports the session dead or closed.
func (t *Table) MarkGone(r *Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.markGoneLocked(r)
}

func (t *Table) markGoneLocked(r *Record) {
	if r.state == Gone {
		return
	}
	t.move(r, Gone)
	t.unschedule(r)
	t.endAllLocked(r)
	t.dropIfDone(r)
}

// BeginClose moves r to Closing so that no later reply extends trust: its
// client asked, which no later call revives. A Draining or Gone record
// stays where it is.
func (t *Table) BeginClose(r *Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch r.state {
	case Provisional, Live, Expiring:
		t.move(r, Closing)
	}
	r.reason = ""
	t.unschedule(r)
}

// RetryCloseLater hands a session whose close (BeginClose) failed to the
// silence loop, which retries with backoff; the record stays Closing and
// keeps who asked (by, rule; caller says they are set) for the audit trail
// of the retried close. A record not kept (closed while Provisional) is
// left to be dropped.
func (t *Table) RetryCloseLater(r *Record, by, rule string, caller bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.state == Gone || !r.kept {
		return
	}
	r.closeBy, r.closeRule, r.closeCaller = by, rule, caller
	r.expireAt = t.now().Add(closeRetryMin)
	t.schedule(r)
}

// SecretHash is the session's secret hash if the table knows it.
func (t *Table) SecretHash(id store.SessionID) []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.recs[id]; r != nil {
		return r.secretHash
	}
	return nil
}

// SetSecretHash remembers the session's secret hash read from the store,
// in its record if there is one.
func (t *Table) SetSecretHash(id store.SessionID, h []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.recs[id]; r != nil {
		r.secretHash = h
	}
}

// Principal is the principal the session is bound to, if the table knows.
func (t *Table) Principal(id store.SessionID) (p string, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.recs[id]; r != nil && r.principalKnown {
		return r.principal, true
	}
	return "", false
}

// SetPrincipal remembers the principal the session is bound to, in its
// record if there is one.
func (t *Table) SetPrincipal(id store.SessionID, p string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.recs[id]; r != nil {
		t.setPrincipalLocked(r, p)
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
