package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/client"
)

// Names of the systems measured.
const (
	sysLockd     = "lockd"
	sysEtcdTxn   = "etcd-txn"
	sysEtcdMutex = "etcd-mutex"
	sysPGRaw     = "pg-raw"
	sysPGRawMin  = "pg-raw-min"
	sysPGRawDef  = "pg-raw-defpool"
	// sysEtcdSession is the idle scenario's raw baseline.
	sysEtcdSession = "etcd-session"
)

// sessionTTL is the TTL of every session, lease and sessions row of every
// system: lockd's default (lock.session.ttl).
const sessionTTL = 15 * time.Second

// setupWidth bounds the concurrent calls that prepare a measurement
// (opening sessions, taking the locks of the death scenario).
const setupWidth = 64

// pgPollMin and pgPollMax bound pg-raw's wait between attempts on a taken
// key (uniformly random in between).
const (
	pgPollMin = 2 * time.Millisecond
	pgPollMax = 10 * time.Millisecond
)

// system is one way of locking that the benchmark measures.
type system interface {
	name() string
	// open starts a client of its own: a session, lease or sessions row.
	open(ctx context.Context) (locker, error)
}

// preparer is a system that sets up for a measurement of c clients
// before they open (and before the clock starts); the returned function
// undoes it after they closed.
type preparer interface {
	prepare(ctx context.Context, c int) (done func(), err error)
}

// locker is one client of a system.
type locker interface {
	// acquire takes key, waiting while another client holds it, and
	// returns the function that releases it.
	acquire(ctx context.Context, key string) (release func(context.Context) error, err error)
	// close ends the client's session.
	close(ctx context.Context) error
}

// dier is a system whose session death the benchmark measures.
type dier interface {
	// die makes one new session hold n locks, keys tag/0 .. tag/n-1, ends
	// the session, and returns the time from ending it until the backend
	// holds none of the keys.
	die(ctx context.Context, tag string, n int) (time.Duration, error)
}

// deathKey is key i of the death scenario under tag.
func deathKey(tag string, i int) string { return tag + "/" + strconv.Itoa(i) }

// waitGone polls count every millisecond from start until it reports no
// keys, and returns the time that took.
func waitGone(ctx context.Context, start time.Time, count func(context.Context) (int64, error)) (time.Duration, error) {
	for {
		n, err := count(ctx)
		if err != nil {
			return 0, fmt.Errorf("count remaining keys: %w", err)
		}
		if n == 0 {
			return time.Since(start), nil
		}
		if err := sleep(ctx, time.Millisecond); err != nil {
			return 0, fmt.Errorf("wait for keys to go (%d left): %w", n, err)
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// parallel calls fn(ctx, i) for i in [0, n), at most width at a time, and
// returns the first error (the others then see ctx cancelled).
func parallel(ctx context.Context, n, width int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
		next  = make(chan int)
	)
	for range min(n, width) {
		wg.Add(1)
		go func() { // exits when next is closed
			defer wg.Done()
			for i := range next {
				if err := fn(ctx, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
						cancel()
					}
					mu.Unlock()
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return first
}

// etcdRetryWait is how long the etcd baselines wait before retrying a
// transient error.
const etcdRetryWait = 20 * time.Millisecond

// etcdTransient reports whether err is a transient etcd error that a
// user's code retries: the server timed out, was briefly unavailable
// (overload, leader change) or refused a proposal while its apply lags
// ("too many requests"), while the caller's ctx is still alive.
func etcdTransient(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	if errors.Is(rpctypes.Error(err), rpctypes.ErrTooManyRequests) {
		return true
	}
	var ee rpctypes.EtcdError
	if errors.As(rpctypes.Error(err), &ee) {
		return ee.Code() == codes.Unavailable || ee.Code() == codes.DeadlineExceeded
	}
	if st, ok := status.FromError(err); ok {
		return st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded
	}
	return false
}

// retrier counts the transient errors a baseline retried.
type retrier struct{ n atomic.Int64 }

// retried reports whether fn's error err is transient; if so it counts it
// and waits etcdRetryWait, so that the caller tries again.
func (r *retrier) retried(ctx context.Context, err error) bool {
	if !etcdTransient(ctx, err) {
		return false
	}
	r.n.Add(1)
	return sleep(ctx, etcdRetryWait) == nil
}

// retries returns how many transient errors were retried so far.
func (r *retrier) retries() int64 { return r.n.Load() }

// ---- lockd ----

// lockdSystem is lockd through the SDK.
type lockdSystem struct {
	c *client.Client
	// label is the system's name when it is not lockd (sysLockdNoStats).
	label string
	// count reports how many grants the backend holds under a key prefix.
	count func(ctx context.Context, prefix string) (int64, error)
}

func (s *lockdSystem) name() string {
	if s.label != "" {
		return s.label
	}
	return sysLockd
}

func (s *lockdSystem) open(ctx context.Context) (locker, error) {
	sess, err := s.c.NewSession(ctx)
	if err != nil {
		return nil, fmt.Errorf("open lockd session: %w", err)
	}
	return lockdLocker{sess}, nil
}

type lockdLocker struct{ s *client.Session }

func (l lockdLocker) acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	lk, err := l.s.Acquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return lk.Release, nil
}

func (l lockdLocker) close(ctx context.Context) error { return l.s.Close(ctx) }

func (s *lockdSystem) die(ctx context.Context, tag string, n int) (time.Duration, error) {
	sess, err := s.c.NewSession(ctx)
	if err != nil {
		return 0, fmt.Errorf("open lockd session: %w", err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = sess.Close(context.WithoutCancel(ctx))
		}
	}()
	err = parallel(ctx, n, setupWidth, func(ctx context.Context, i int) error {
		_, err := sess.Acquire(ctx, deathKey(tag, i))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("take %d locks: %w", n, err)
	}
	if held, err := s.count(ctx, tag+"/"); err != nil || held != int64(n) {
		return 0, fmt.Errorf("lockd holds %d of %d locks before the close (%v)", held, n, err)
	}
	start := time.Now()
	closed = true
	if err := sess.Close(ctx); err != nil {
		return 0, fmt.Errorf("close session: %w", err)
	}
	return waitGone(ctx, start, func(ctx context.Context) (int64, error) { return s.count(ctx, tag+"/") })
}

// ---- raw etcd ----

// etcdTxnSystem is a lock built directly on etcd transactions.
type etcdTxnSystem struct {
	retrier
	cli    *clientv3.Client
	prefix string
}

func (s *etcdTxnSystem) name() string { return sysEtcdTxn }

func (s *etcdTxnSystem) open(ctx context.Context) (locker, error) {
	lease, err := s.cli.Grant(ctx, int64(sessionTTL/time.Second))
	if err != nil {
		return nil, fmt.Errorf("grant lease: %w", err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	ch, err := s.cli.KeepAlive(kctx, lease.ID)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("keep lease alive: %w", err)
	}
	l := &etcdTxnLocker{sys: s, lease: lease.ID, stop: cancel, done: make(chan struct{})}
	go func() { // exits when close cancels kctx: clientv3 then closes ch
		defer close(l.done)
		for range ch {
		}
	}()
	return l, nil
}

type etcdTxnLocker struct {
	sys   *etcdTxnSystem
	lease clientv3.LeaseID
	stop  context.CancelFunc
	done  chan struct{}
}

func (l *etcdTxnLocker) acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	_, release, err := l.take(ctx, key, "")
	return release, err
}

// take is acquire that puts val as the key's value; it also returns the
// key's create revision, which tells this holding from every other.
func (l *etcdTxnLocker) take(ctx context.Context, key, val string) (int64, func(context.Context) error, error) {
	cli, k := l.sys.cli, l.sys.prefix+key
	for {
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, val, clientv3.WithLease(l.lease))).
			Else(clientv3.OpGet(k, clientv3.WithKeysOnly())).
			Commit()
		if l.sys.retried(ctx, err) {
			continue
		}
		if err != nil {
			return 0, nil, err
		}
		release := func(ctx context.Context) error {
			for {
				_, err := cli.Delete(ctx, k)
				if !l.sys.retried(ctx, err) {
					return err
				}
			}
		}
		if resp.Succeeded {
			return resp.Header.Revision, release, nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		switch {
		case len(kvs) == 0:
			continue // deleted in between
		case clientv3.LeaseID(kvs[0].Lease) == l.lease:
			return kvs[0].CreateRevision, release, nil // put by an earlier attempt whose answer was lost
		}
		if err := waitDelete(ctx, cli, k, resp.Header.Revision+1); err != nil && !l.sys.retried(ctx, err) {
			return 0, nil, err
		}
	}
}

// waitDelete waits for a delete of key at or after revision rev.
func waitDelete(ctx context.Context, cli *clientv3.Client, key string, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range cli.Watch(wctx, key, clientv3.WithRev(rev), clientv3.WithFilterPut()) {
		if err := wr.Err(); err != nil {
			return err
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("watch closed")
}

func (l *etcdTxnLocker) close(ctx context.Context) error {
	l.stop()
	<-l.done
	if _, err := l.sys.cli.Revoke(ctx, l.lease); err != nil {
		return fmt.Errorf("revoke lease: %w", err)
	}
	return nil
}

// etcdMaxTxnOps is etcd's default limit of operations in one transaction.
const etcdMaxTxnOps = 128

func (s *etcdTxnSystem) count(ctx context.Context, prefix string) (int64, error) {
	resp, err := s.cli.Get(ctx, s.prefix+prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Count, nil
}

func (s *etcdTxnSystem) die(ctx context.Context, tag string, n int) (time.Duration, error) {
	lease, err := s.cli.Grant(ctx, int64(4*sessionTTL/time.Second)) // long enough for the setup
	if err != nil {
		return 0, fmt.Errorf("grant lease: %w", err)
	}
	revoked := false
	defer func() {
		if !revoked {
			_, _ = s.cli.Revoke(context.WithoutCancel(ctx), lease.ID)
		}
	}()
	batches := (n + etcdMaxTxnOps - 1) / etcdMaxTxnOps
	err = parallel(ctx, batches, 8, func(ctx context.Context, b int) error {
		var ops []clientv3.Op
		for i := b * etcdMaxTxnOps; i < min(n, (b+1)*etcdMaxTxnOps); i++ {
			ops = append(ops, clientv3.OpPut(s.prefix+deathKey(tag, i), "", clientv3.WithLease(lease.ID)))
		}
		_, err := s.cli.Txn(ctx).Then(ops...).Commit()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("put %d keys: %w", n, err)
	}
	if held, err := s.count(ctx, tag+"/"); err != nil || held != int64(n) {
		return 0, fmt.Errorf("etcd holds %d of %d keys before the revoke (%v)", held, n, err)
	}
	start := time.Now()
	revoked = true
	if _, err := s.cli.Revoke(ctx, lease.ID); err != nil {
		return 0, fmt.Errorf("revoke lease: %w", err)
	}
	return waitGone(ctx, start, func(ctx context.Context) (int64, error) { return s.count(ctx, tag+"/") })
}

// ---- etcd concurrency.Mutex ----

// etcdMutexSystem is etcd's own lock recipe.
type etcdMutexSystem struct {
	retrier
	cli    *clientv3.Client
	prefix string
}

func (s *etcdMutexSystem) name() string { return sysEtcdMutex }

// open grants the session's lease under the client's own context (not
// ctx): concurrency.Session keeps it alive, and revokes it on Close, under
// that context.
func (s *etcdMutexSystem) open(context.Context) (locker, error) {
	sess, err := concurrency.NewSession(s.cli, concurrency.WithTTL(int(sessionTTL/time.Second)))
	if err != nil {
		return nil, fmt.Errorf("open concurrency session: %w", err)
	}
	return &etcdMutexLocker{sys: s, sess: sess}, nil
}

type etcdMutexLocker struct {
	sys  *etcdMutexSystem
	sess *concurrency.Session
}

func (l *etcdMutexLocker) acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	m := concurrency.NewMutex(l.sess, l.sys.prefix+key)
	for {
		err := m.Lock(ctx) // a retry finds its own key from the lost attempt
		if l.sys.retried(ctx, err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			for {
				err := m.Unlock(ctx)
				if !l.sys.retried(ctx, err) {
					return err
				}
			}
		}, nil
	}
}

func (l *etcdMutexLocker) close(context.Context) error {
	if err := l.sess.Close(); err != nil {
		return fmt.Errorf("close concurrency session: %w", err)
	}
	return nil
}

// ---- raw PostgreSQL ----

// pgRawSystem is a lock built directly on PostgreSQL rows: pg-raw (a
// sessions table, ON DELETE CASCADE, tokens from a sequence), pg-raw-min
// (one table with a primary key, nothing else) or pg-raw-defpool (pg-raw
// through pgxpool's default pool).
type pgRawSystem struct {
	sysName string
	// minimal selects the primary-key-only schema: no sessions, no death.
	minimal bool
	// sized makes each measurement's pool exactly as large as its number
	// of clients; otherwise it has the DSN's (pgxpool's default) size.
	sized bool
	// base configures the pools (from the DSN).
	base *pgxpool.Config
	// setup is the bench's own pool: sessions of the death scenario,
	// counting.
	setup *pgxpool.Pool
	// cur is the pool of the measurement in progress (set by prepare).
	cur *pgxpool.Pool
	q   pgRawQueries
}

// pgRawQueries are pg-raw's statements in its schema.
type pgRawQueries struct {
	schema       []string // DDL, in order
	openSession  string
	closeSession string
	acquire      string
	release      string
	insertMany   string
	count        string
	// The election row's hand-rolled election (not minimal): the lock of
	// acquire on a table of its own that also holds the leader's value.
	campaign string
	resign   string
	leader   string
	// The semaphore row's N slot rows (pg-sem, not minimal).
	makeSlots string
	takeSlot  string
	freeSlot  string
}

func newPGRawQueries(schema string, minimal bool) pgRawQueries {
	s := pgx.Identifier{schema}.Sanitize()
	seq := pgx.Identifier{schema, "token"}.Sanitize()
	if minimal {
		return pgRawQueries{
			schema: []string{
				`CREATE SCHEMA ` + s,
				`CREATE TABLE ` + s + `.locks (key text COLLATE "C" PRIMARY KEY, token bigint NOT NULL)`,
			},
			acquire: `INSERT INTO ` + s + `.locks (key, token) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING RETURNING token`,
			release: `DELETE FROM ` + s + `.locks WHERE key = $1 AND token = $2`,
			count:   `SELECT count(*) FROM ` + s + `.locks WHERE starts_with(key, $1)`,
		}
	}
	return pgRawQueries{
		schema: []string{
			`CREATE SCHEMA ` + s,
			`CREATE SEQUENCE ` + seq,
			`CREATE TABLE ` + s + `.sessions (id text PRIMARY KEY, expires_at timestamptz NOT NULL)`,
			`CREATE TABLE ` + s + `.locks (key text COLLATE "C" PRIMARY KEY,
				session_id text NOT NULL REFERENCES ` + s + `.sessions (id) ON DELETE CASCADE,
				token bigint NOT NULL)`,
			`CREATE INDEX ON ` + s + `.locks (session_id)`,
			`CREATE TABLE ` + s + `.leaders (name text COLLATE "C" PRIMARY KEY,
				session_id text NOT NULL REFERENCES ` + s + `.sessions (id) ON DELETE CASCADE,
				token bigint NOT NULL, value bytea NOT NULL)`,
			`CREATE TABLE ` + s + `.slots (sem text COLLATE "C", slot int,
				session_id text REFERENCES ` + s + `.sessions (id) ON DELETE SET NULL,
				token bigint, PRIMARY KEY (sem, slot))`,
			`CREATE INDEX ON ` + s + `.slots (session_id)`,
		},
		openSession:  `INSERT INTO ` + s + `.sessions (id, expires_at) VALUES ($1, now() + $2::bigint * interval '1 millisecond')`,
		closeSession: `DELETE FROM ` + s + `.sessions WHERE id = $1`,
		acquire: `INSERT INTO ` + s + `.locks (key, session_id, token) VALUES ($1, $2, nextval('` + seq + `'))
			ON CONFLICT (key) DO NOTHING RETURNING token`,
		release: `DELETE FROM ` + s + `.locks WHERE key = $1 AND token = $2`,
		insertMany: `INSERT INTO ` + s + `.locks (key, session_id, token)
			SELECT $2::text || g::text, $1, nextval('` + seq + `') FROM generate_series(0, $3::int - 1) g`,
		count: `SELECT count(*) FROM ` + s + `.locks WHERE starts_with(key, $1)`,
		campaign: `INSERT INTO ` + s + `.leaders (name, session_id, token, value) VALUES ($1, $2, nextval('` + seq + `'), $3)
			ON CONFLICT (name) DO NOTHING RETURNING token`,
		resign: `DELETE FROM ` + s + `.leaders WHERE name = $1 AND token = $2`,
		leader: `SELECT token FROM ` + s + `.leaders WHERE name = $1`,
		makeSlots: `INSERT INTO ` + s + `.slots (sem, slot) SELECT $1, g FROM generate_series(0, $2::int - 1) g
			ON CONFLICT (sem, slot) DO NOTHING`,
		takeSlot: `UPDATE ` + s + `.slots SET session_id = $2, token = nextval('` + seq + `')
			WHERE (sem, slot) = (SELECT sem, slot FROM ` + s + `.slots WHERE sem = $1 AND session_id IS NULL
				LIMIT 1 FOR UPDATE SKIP LOCKED) AND session_id IS NULL
			RETURNING slot, token`,
		freeSlot: `UPDATE ` + s + `.slots SET session_id = NULL, token = NULL WHERE sem = $1 AND slot = $2 AND token = $3`,
	}
}

func (s *pgRawSystem) name() string { return s.sysName }

// pool is the pool of the measurement in progress, else the setup pool.
func (s *pgRawSystem) pool() *pgxpool.Pool {
	if s.cur != nil {
		return s.cur
	}
	return s.setup
}

// prepare opens the measurement's pool for c clients (c connections, or
// the DSN's default size) and opens every connection before the clock
// starts, as a careful engineer's service does at start-up.
func (s *pgRawSystem) prepare(ctx context.Context, c int) (func(), error) {
	size := int(s.base.MaxConns)
	if s.sized {
		size = c
	}
	pool, err := openWarmPool(ctx, s.base, size)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.sysName, err)
	}
	s.cur = pool
	return func() { s.cur = nil; pool.Close() }, nil
}

// openWarmPool opens a pool of exactly size connections from base and
// has every one of them answer a query before returning.
func openWarmPool(ctx context.Context, base *pgxpool.Config, size int) (*pgxpool.Pool, error) {
	cfg := base.Copy()
	cfg.MaxConns, cfg.MinConns = int32(size), int32(size)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open a pool of %d: %w", size, err)
	}
	conns := make([]*pgxpool.Conn, size)
	err = parallel(ctx, size, size, func(ctx context.Context, i int) error {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns[i] = c
		_, err = c.Exec(ctx, "SELECT 1")
		return err
	})
	for _, c := range conns {
		if c != nil {
			c.Release()
		}
	}
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("warm a pool of %d: %w", size, err)
	}
	return pool, nil
}

func (s *pgRawSystem) openSession(ctx context.Context, pool *pgxpool.Pool, ttl time.Duration) (string, error) {
	id := rand.Text()
	if _, err := pool.Exec(ctx, s.q.openSession, id, ttl.Milliseconds()); err != nil {
		return "", fmt.Errorf("insert session: %w", err)
	}
	return id, nil
}

func (s *pgRawSystem) open(ctx context.Context) (locker, error) {
	l := &pgRawLocker{sys: s, pool: s.pool()}
	if s.minimal {
		return l, nil
	}
	id, err := s.openSession(ctx, l.pool, sessionTTL)
	if err != nil {
		return nil, err
	}
	l.id = id
	return l, nil
}

type pgRawLocker struct {
	sys  *pgRawSystem
	pool *pgxpool.Pool
	id   string // session (not minimal)
	// made are the semaphores whose slot rows this client made (pg-sem).
	made map[string]bool
}

func (l *pgRawLocker) acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	pool := l.pool
	for {
		var (
			token int64
			err   error
		)
		if l.sys.minimal {
			err = pool.QueryRow(ctx, l.sys.q.acquire, key, mrand.Int64()).Scan(&token)
		} else {
			err = pool.QueryRow(ctx, l.sys.q.acquire, key, l.id).Scan(&token)
		}
		if errors.Is(err, pgx.ErrNoRows) {
			if err := sleep(ctx, pgPollMin+mrand.N(pgPollMax-pgPollMin)); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			tag, err := pool.Exec(ctx, l.sys.q.release, key, token)
			if err == nil && tag.RowsAffected() != 1 {
				err = fmt.Errorf("release %q token %d: no such lock", key, token)
			}
			return err
		}, nil
	}
}

func (l *pgRawLocker) close(ctx context.Context) error {
	if l.sys.minimal {
		return nil
	}
	if _, err := l.pool.Exec(ctx, l.sys.q.closeSession, l.id); err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	return nil
}

func (s *pgRawSystem) count(ctx context.Context, prefix string) (int64, error) {
	var n int64
	err := s.setup.QueryRow(ctx, s.q.count, prefix).Scan(&n)
	return n, err
}

func (s *pgRawSystem) die(ctx context.Context, tag string, n int) (time.Duration, error) {
	if s.minimal {
		return 0, fmt.Errorf("%s has no sessions", s.sysName)
	}
	pool := s.setup
	id, err := s.openSession(ctx, pool, 4*sessionTTL)
	if err != nil {
		return 0, err
	}
	deleted := false
	defer func() {
		if !deleted {
			_, _ = pool.Exec(context.WithoutCancel(ctx), s.q.closeSession, id)
		}
	}()
	if _, err := pool.Exec(ctx, s.q.insertMany, id, tag+"/", n); err != nil {
		return 0, fmt.Errorf("insert %d locks: %w", n, err)
	}
	if held, err := s.count(ctx, tag+"/"); err != nil || held != int64(n) {
		return 0, fmt.Errorf("postgresql holds %d of %d locks before the delete (%v)", held, n, err)
	}
	start := time.Now()
	deleted = true
	if _, err := pool.Exec(ctx, s.q.closeSession, id); err != nil {
		return 0, fmt.Errorf("delete session: %w", err)
	}
	return waitGone(ctx, start, func(ctx context.Context) (int64, error) { return s.count(ctx, tag+"/") })
}
