package pgstore

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/internal/deadlock"
	"lock.dev/lockd/store/internal/groupcommit"
)

// Defaults of Options.
const (
	DefaultSchema         = "lockd"
	DefaultReaperInterval = time.Second
)

const (
	// commitTimeout bounds a COMMIT, which runs detached from the caller's
	// context so the outcome of a write is always known (see inTx).
	commitTimeout = 5 * time.Second
	// cleanupTimeout bounds the removal of a waiter row after its Acquire
	// gave up, and other best-effort cleanups.
	cleanupTimeout = 5 * time.Second
)

// Options configure a Store.
type Options struct {
	// DSN is the PostgreSQL connection string (lock.pg.dsn), used when Pool
	// is nil.
	DSN string
	// Pool, if set, is used instead of opening a pool from DSN; the Store
	// does not close it. The notification listener still opens one
	// connection of its own from the pool's connection config. The Store
	// raises the token sequence at New only, not on the pool's new
	// connections (C2 #ct2-fencing: after a failover, restart lockd).
	Pool *pgxpool.Pool
	// Schema holds lockd's tables (lock.pg.schema): a lower-case SQL
	// identifier. Default DefaultSchema.
	Schema string
	// ReaperInterval is how often expired sessions are deleted
	// (lock.pg.reaper-interval). Default DefaultReaperInterval.
	ReaperInterval time.Duration
	// MaxConns is the size of the pool New opens from DSN
	// (lock.pg.max-conns); 0 keeps the DSN's pool_max_conns, or pgxpool's
	// default. Ignored with Pool.
	MaxConns int
	// Logger receives the C4 log events; nil discards them.
	Logger *slog.Logger
	// Metrics records the C4 metrics; nil records nothing.
	Metrics *telemetry.Metrics

	// probeInterval overrides listenerProbeInterval (tests).
	probeInterval time.Duration
	// recheckInterval overrides recheckInterval (tests: a long one shows
	// that every grant came from a wake-up, not from the safety net).
	recheckInterval time.Duration
	// deadlockInterval overrides deadlock.Interval (tests); negative:
	// the detector never scans on its own (tests scan by hand).
	deadlockInterval time.Duration
	// onLockBatch, if set, is called with every lock batch before it runs
	// (tests).
	onLockBatch func(batch []*lockReq)
	// onLocksOfBatch, if set, is called with the size of every LocksOf
	// batch before it runs (tests).
	onLocksOfBatch func(n int)
	// noticeGate, if set, holds every notification the listener receives
	// until it is closed (tests: the notification path held back).
	noticeGate chan struct{}
	// onHandOver, if set, is called after a release's hand-over committed,
	// before this Store's waiter is told (tests).
	onHandOver func(key string)
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
	recheck        time.Duration // recheckInterval, unless a test set another
	log            telemetry.Log
	metrics        *telemetry.Metrics
	instance       string // distinguishes this Store's sync markers

	stop      context.CancelFunc // stops the reaper, the listener and the deadlock detector
	wg        sync.WaitGroup     // the reaper, the listener and the deadlock detector
	deadlocks *deadlock.Detector // C2 #ct2-deadlock (deadlock.go)
	closeOnce sync.Once

	lockQ       *groupcommit.Queue[*lockReq]  // group commit of grants and releases
	hbQ         *groupcommit.Queue[*hbReq]    // group commit of heartbeats
	locksQ      *groupcommit.Queue[*locksReq] // shared reads of LocksOf
	batchers    sync.WaitGroup                // the workers of lockQ, hbQ and locksQ
	onLockBatch func(batch []*lockReq)
	onLocksOf   func(n int)
	noticeGate  chan struct{}
	onHandOver  func(key string)
	// commitHook, set by tests after New, is called by the lock worker
	// with each batch's keys before it runs (storetest's HoldCommit).
	commitHook atomic.Pointer[func(keys []string)]

	mu        sync.Mutex
	closed    bool
	closing   chan struct{} // closed by Close: waiting Acquires give up
	acquires  sync.WaitGroup
	listening bool // the listener's LISTEN is in effect
	watches   map[*watch]struct{}
	waiters   map[string]map[*waiter]struct{}
	syncSeq   uint64

	// standingChecks counts the notifications deliver checked against the
	// table (tests read it).
	standingChecks atomic.Int64
	// gone: the grants this Store's lock batches ended (gone.go).
	gone goneGrants
}

var _ store.LockStore = (*Store)(nil)

// New connects to PostgreSQL, brings the schema up to date, raises the
// fencing-token sequence to the wall clock (epoch.go), starts the
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
	if opts.MaxConns < 0 || opts.MaxConns > math.MaxInt32 {
		return nil, fmt.Errorf("pgstore: max conns %d out of range: %w", opts.MaxConns, store.ErrInvalidArgument)
	}
	pool, ownPool := opts.Pool, false
	if pool == nil {
		cfg, err := pgxpool.ParseConfig(opts.DSN)
		if err != nil {
			return nil, fmt.Errorf("pgstore: parse dsn: %w: %v", store.ErrInvalidArgument, err)
		}
		if opts.MaxConns > 0 {
			cfg.MaxConns = int32(opts.MaxConns)
		}
		// Every new connection raises the token sequence first (epoch.go):
		// after a failover every connection is new.
		cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			return raiseTokens(ctx, conn, seqIdent(schema), time.Now(), true)
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
		recheck:        cmp.Or(opts.recheckInterval, recheckInterval),
		log:            telemetry.Log{L: opts.Logger, Backend: "pg"},
		metrics:        opts.Metrics,
		instance:       rand.Text(),
		closing:        make(chan struct{}),
		watches:        make(map[*watch]struct{}),
		waiters:        make(map[string]map[*waiter]struct{}),
		onLockBatch:    opts.onLockBatch,
		onLocksOf:      opts.onLocksOfBatch,
		noticeGate:     opts.noticeGate,
		onHandOver:     opts.onHandOver,
	}
	if err := s.applyMigrations(ctx); err != nil {
		s.closePool()
		return nil, err
	}
	if err := s.raiseTokensOnOpen(ctx); err != nil {
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
	s.deadlocks = deadlock.New(s.waitGraph)
	s.wg.Add(2)
	go s.listen(bg, conn) // exits when Close cancels bg
	go s.reapLoop(bg)     // exits when Close cancels bg
	if d := cmp.Or(opts.deadlockInterval, deadlock.Interval); d > 0 {
		s.wg.Add(1)
		go func() { // exits when Close cancels bg
			defer s.wg.Done()
			s.deadlocks.Run(bg, d)
		}()
	}
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

// PoolMaxConns is the size of the Store's connection pool
// (lock.pg.max-conns, or the DSN's pool_max_conns).
func (s *Store) PoolMaxConns() int { return int(s.pool.Config().MaxConns) }

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
