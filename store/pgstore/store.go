package pgstore

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// Defaults of Options.
const (
	DefaultSchema         = "lockd"
	DefaultReaperInterval = time.Second
)

const (
	// recheckInterval is how often a waiting Acquire re-checks its queue
	// without being woken: the safety net for a lost notification. Wake-ups
	// normally come from NOTIFY within one commit.
	recheckInterval = 3 * time.Second
	// commitTimeout bounds a COMMIT, which runs detached from the caller's
	// context so the outcome of a write is always known (see inTx).
	commitTimeout = 5 * time.Second
	// cleanupTimeout bounds the removal of a waiter row after its Acquire
	// gave up, and other best-effort cleanups.
	cleanupTimeout = 5 * time.Second
	// watchBuffer is how many events a watch consumer may fall behind
	// before its watch breaks with ErrContention.
	watchBuffer = 256
	// reapBatch is how many sessions one reaper transaction deletes.
	reapBatch = 500
	// reapTimeout bounds one reaper run, so a hung connection cannot stall
	// the reaper for longer.
	reapTimeout = 30 * time.Second
	// listenerProbeInterval is how long the listening connection may be
	// quiet before the listener checks that it still answers, and
	// listenerProbeTimeout how long that check may take.
	listenerProbeInterval = 10 * time.Second
	listenerProbeTimeout  = 5 * time.Second
	// listenerConnectTimeout bounds one attempt to re-open the listening
	// connection.
	listenerConnectTimeout = 10 * time.Second
)

// Options configure a Store.
type Options struct {
	// DSN is the PostgreSQL connection string (lock.pg.dsn), used when Pool
	// is nil.
	DSN string
	// Pool, if set, is used instead of opening a pool from DSN; the Store
	// does not close it. The notification listener still opens one
	// connection of its own from the pool's connection config.
	Pool *pgxpool.Pool
	// Schema holds lockd's tables (lock.pg.schema): a lower-case SQL
	// identifier. Default DefaultSchema.
	Schema string
	// ReaperInterval is how often expired sessions are deleted
	// (lock.pg.reaper-interval). Default DefaultReaperInterval.
	ReaperInterval time.Duration
	// Logger receives the C4 log events; nil discards them.
	Logger *slog.Logger
	// Metrics records the C4 metrics; nil records nothing.
	Metrics *telemetry.Metrics

	// probeInterval overrides listenerProbeInterval (tests).
	probeInterval time.Duration
	// onLockBatch, if set, is called with every lock batch before it runs
	// (tests).
	onLockBatch func(batch []*lockReq)
}

// Store is the PostgreSQL store.LockStore. It is safe for concurrent use.
type Store struct {
	pool           *pgxpool.Pool
	ownPool        bool
	listenConfig   *pgx.ConnConfig
	schema         string
	channel        string
	q              queries
	reaperInterval time.Duration
	probeInterval  time.Duration // listenerProbeInterval, unless a test set another
	log            telemetry.Log
	metrics        *telemetry.Metrics
	instance       string // distinguishes this Store's sync markers

	stop      context.CancelFunc // stops the reaper and the listener
	wg        sync.WaitGroup     // the reaper and the listener
	closeOnce sync.Once

	lockQ       *batchQueue[*lockReq] // group commit of grants and releases
	hbQ         *batchQueue[*hbReq]   // group commit of heartbeats
	batchers    sync.WaitGroup        // the workers of lockQ and hbQ
	onLockBatch func(batch []*lockReq)

	mu        sync.Mutex
	closed    bool
	closing   chan struct{} // closed by Close: waiting Acquires give up
	acquires  sync.WaitGroup
	listening bool // the listener's LISTEN is in effect
	watches   map[*watch]struct{}
	waiters   map[string]map[*waiter]struct{}
	syncSeq   uint64
}

var _ store.LockStore = (*Store)(nil)

// New connects to PostgreSQL, brings the schema up to date, starts the
// notification listener and the reaper, and returns the Store. The caller
// must Close it.
func New(ctx context.Context, opts Options) (*Store, error) {
	schema := opts.Schema
	if schema == "" {
		schema = DefaultSchema
	}
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	interval := opts.ReaperInterval
	if interval == 0 {
		interval = DefaultReaperInterval
	}
	if interval < 0 {
		return nil, fmt.Errorf("pgstore: reaper interval %v is negative: %w", interval, store.ErrInvalidArgument)
	}
	pool, ownPool := opts.Pool, false
	if pool == nil {
		cfg, err := pgxpool.ParseConfig(opts.DSN)
		if err != nil {
			return nil, fmt.Errorf("pgstore: parse dsn: %w: %v", store.ErrInvalidArgument, err)
		}
		if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			return nil, classify(ctx, "open pool", err)
		}
		ownPool = true
	}
	sum := sha256.Sum256([]byte(schema))
	s := &Store{
		pool:           pool,
		ownPool:        ownPool,
		listenConfig:   pool.Config().ConnConfig,
		schema:         schema,
		channel:        "lockd_" + hex.EncodeToString(sum[:8]),
		q:              newQueries(schema, "lockd_"+hex.EncodeToString(sum[:8])),
		reaperInterval: interval,
		probeInterval:  cmp.Or(opts.probeInterval, listenerProbeInterval),
		log:            telemetry.Log{L: opts.Logger, Backend: "pg"},
		metrics:        opts.Metrics,
		instance:       rand.Text(),
		closing:        make(chan struct{}),
		watches:        make(map[*watch]struct{}),
		waiters:        make(map[string]map[*waiter]struct{}),
		onLockBatch:    opts.onLockBatch,
	}
	start := time.Now()
	err := classify(ctx, "migrate", migrate(ctx, pool, schema, s.channel))
	s.metrics.Request(telemetry.OpMigrate, start, err)
	if err != nil {
		s.closePool()
		return nil, err
	}
	conn, err := s.connectListener(ctx)
	if err != nil {
		s.closePool()
		return nil, classify(ctx, "listen", err)
	}
	s.listening = true
	bg, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.wg.Add(2)
	go s.listen(bg, conn) // exits when Close cancels bg
	go s.reapLoop(bg)     // exits when Close cancels bg
	s.startBatchers()
	return s, nil
}

// Close stops the reaper, the listener and the group-commit workers and
// waits for them (a batch in flight finishes; queued requests fail with
// ErrUnavailable), ends every watch (with a final Event carrying
// ErrUnavailable), makes waiting Acquire calls return, and closes the pool if New opened it. Sessions are not
// closed: they expire on their own unless another instance keeps them
// alive. Close is idempotent and always returns nil.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.closing)
		for w := range s.watches {
			s.endWatch(w, errClosed)
		}
		s.mu.Unlock()
		s.stopBatchers()
		s.stop()
		s.wg.Wait()
		s.acquires.Wait() // no new Add after closed is set
		s.closePool()
	})
	return nil
}

func (s *Store) closePool() {
	if s.ownPool {
		s.pool.Close()
	}
}

// checkOpen returns errClosed after Close, else nil.
func (s *Store) checkOpen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	return nil
}

// begin is the common prologue of every operation: the store is open and
// the caller's context is not done yet.
func (s *Store) begin(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgstore: %s: %w", op, err)
	}
	return s.checkOpen()
}

// inTx runs fn in a transaction. Statements run under the caller's context:
// if it ends, the transaction rolls back and nothing is written. COMMIT runs
// detached from it (bounded by commitTimeout), so once fn has done its work
// the caller learns the real outcome instead of a cancellation that may or
// may not have committed. A commit that fails on a broken connection is
// ErrUnavailable after classify; every write here is safe to retry (a
// retried grant finds its own grant, a retried release reports ErrNotOwner).
func (s *Store) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = tx.Rollback(rctx) // no-op after a commit
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	return tx.Commit(cctx)
}

// OpenSession implements store.SessionRegistry.
func (s *Store) OpenSession(ctx context.Context, ttl time.Duration) (store.Session, error) {
	if err := store.ValidateTTL(ttl); err != nil {
		return store.Session{}, fmt.Errorf("pgstore: open session: %w", err)
	}
	if err := s.begin(ctx, "open session"); err != nil {
		return store.Session{}, err
	}
	start := time.Now()
	id := store.NewSessionID()
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, s.q.openSession, string(id), ttl.Milliseconds())
		return err
	})
	err = classify(ctx, "open session", err)
	s.metrics.Request(telemetry.OpOpenSession, start, err)
	if err != nil {
		return store.Session{}, err
	}
	s.log.SessionOpened(id, ttl)
	s.metrics.SessionOpened()
	// expires_at = now() + ttl, and the database's now() is later than our
	// receipt of the call: the full TTL is a lower bound from receipt.
	return store.Session{ID: id, TTL: ttl, Remaining: ttl}, nil
}

// Heartbeat implements store.SessionRegistry. It extends a live session by
// its TTL from the database's now(); an expired session (even one the reaper
// has not deleted yet) is never extended and is reported not live.
// Concurrent heartbeats share one UPDATE (group commit).
func (s *Store) Heartbeat(ctx context.Context, id store.SessionID) (store.Liveness, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return store.Liveness{}, fmt.Errorf("pgstore: heartbeat: %w", err)
	}
	if err := s.begin(ctx, "heartbeat"); err != nil {
		return store.Liveness{}, err
	}
	start := time.Now()
	r := &hbReq{id: id}
	j, err := s.hbQ.submit(ctx, "", r)
	if err == nil {
		if _, err = s.hbQ.wait(ctx, j); err == nil {
			err = r.err
		}
	}
	err = result(ctx, "heartbeat", err)
	s.metrics.Request(telemetry.OpHeartbeat, start, err)
	if err != nil || !r.live {
		return store.Liveness{}, err
	}
	// The new expires_at is now() + TTL with the database's now() later
	// than our receipt of the call (C2 #ct2-deadline).
	return store.Liveness{Live: true, Remaining: time.Duration(r.ttlMS) * time.Millisecond}, nil
}

// CloseSession implements store.SessionRegistry. Deleting the session row
// deletes its locks and queue entries by cascade; the watch reports those
// locks as EventExpired. A session that had already expired (but was not yet
// reaped) is deleted as the reaper would and counts as 0 released: its
// locks were already forfeit.
func (s *Store) CloseSession(ctx context.Context, id store.SessionID) (int, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return 0, fmt.Errorf("pgstore: close session: %w", err)
	}
	if err := s.begin(ctx, "close session"); err != nil {
		return 0, err
	}
	start := time.Now()
	var found, live bool
	var grants []store.Grant
	// FOR UPDATE waits for and then excludes concurrent grants, so the
	// locks deleted are all the session had. The transaction sends their
	// events itself (notifyExpired) rather than through the trigger. It runs
	// detached from ctx (bounded by commitTimeout), like a COMMIT in inTx,
	// so the outcome is always known; three round trips.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	b.Queue(s.q.closeLock, string(id)).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&live)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		found = err == nil
		return err
	})
	b.Queue(s.q.notifiedSelf)
	b.Queue(s.q.closeLocks, string(id)).Query(func(rows pgx.Rows) error {
		var key string
		var tok int64
		_, err := pgx.ForEachRow(rows, []any{&key, &tok}, func() error {
			grants = append(grants, store.Grant{Key: key, Session: id, Token: uint64(tok)})
			return nil
		})
		return err
	})
	b.Queue(s.q.closeDelete, string(id))
	br := s.pool.SendBatch(bctx, &b)
	tx := br.Tx()
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = tx.Rollback(rctx) // no-op after a commit
	}()
	err := br.Close()
	if err == nil {
		err = s.notifyExpired(bctx, tx, grants)
	}
	if err == nil {
		err = tx.Commit(bctx)
	}
	err = classify(ctx, "close session", err)
	s.metrics.Request(telemetry.OpCloseSession, start, err)
	if err != nil || !found {
		return 0, err
	}
	if !live {
		s.sessionExpired(id, grants)
		return 0, nil
	}
	s.logReleased(grants, telemetry.ReleaseSessionClosed)
	s.metrics.Released(telemetry.ReleaseSessionClosed, len(grants))
	s.metrics.SessionEnded("")
	s.log.SessionClosed(id, len(grants))
	return len(grants), nil
}

// logReleased logs lock_released for each of grants, in key order; nothing
// at all (not even the sort) when the logger discards info events, which
// matters for a session with 10 000 locks.
func (s *Store) logReleased(grants []store.Grant, reason string) {
	if !telemetry.OrDiscard(s.log.L).Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	slices.SortFunc(grants, func(a, b store.Grant) int { return strings.Compare(a.Key, b.Key) })
	for _, g := range grants {
		s.log.LockReleased(g, reason)
	}
}

// sessionExpired records the C4 telemetry of a session that ended by expiry,
// with the grants that went with it.
func (s *Store) sessionExpired(id store.SessionID, grants []store.Grant) {
	s.logReleased(grants, telemetry.ReleaseSessionLost)
	s.metrics.Released(telemetry.ReleaseSessionLost, len(grants))
	s.log.LeaseExpired(id)
	s.log.SessionLost(id, telemetry.LostLeaseExpired)
	s.metrics.LeaseExpired()
	s.metrics.SessionEnded(telemetry.LostLeaseExpired)
}

// LocksOf implements store.SessionRegistry.
func (s *Store) LocksOf(ctx context.Context, id store.SessionID) ([]store.Grant, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return nil, fmt.Errorf("pgstore: locks of: %w", err)
	}
	if err := s.begin(ctx, "locks of"); err != nil {
		return nil, err
	}
	start := time.Now()
	found, live := false, false
	grants := []store.Grant{}
	rows, err := s.pool.Query(ctx, s.q.locksOf, string(id))
	if err == nil {
		var key *string
		var tok *int64
		var at *time.Time
		_, err = pgx.ForEachRow(rows, []any{&live, &key, &tok, &at}, func() error {
			found = true
			if key != nil { // the LEFT JOIN found a lock
				grants = append(grants, store.Grant{Key: *key, Session: id, Token: uint64(*tok), AcquiredAt: *at})
			}
			return nil
		})
	}
	err = classify(ctx, "locks of", err)
	s.metrics.Request(telemetry.OpLocksOf, start, err)
	if err != nil {
		return nil, err
	}
	if !found || !live {
		return nil, fmt.Errorf("pgstore: locks of: %w", store.ErrSessionDead)
	}
	return grants, nil
}

// schemaIdent is the quoted schema name.
func (s *Store) schemaIdent() string { return pgx.Identifier{s.schema}.Sanitize() }

// ValidateSchema checks C5's rule for lock.pg.schema: a lower-case SQL
// identifier ([a-z_][a-z0-9_]*, at most 63 bytes). The error wraps
// store.ErrInvalidArgument.
func ValidateSchema(s string) error {
	ok := s != "" && len(s) <= 63
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = c == '_' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9'
	}
	if !ok {
		return fmt.Errorf("pgstore: schema %q must be a lower-case SQL identifier ([a-z_][a-z0-9_]*, at most 63 bytes): %w",
			s, store.ErrInvalidArgument)
	}
	return nil
}
