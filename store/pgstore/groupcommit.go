package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/internal/groupcommit"
)

// Group commit: concurrent grants and releases of one Store share
// one transaction, concurrent heartbeats one UPDATE, and concurrent LocksOf
// reads one SELECT.
const (
	// lockWorkers is how many lock batches may be in flight at once, and
	// heartbeatWorkers how many heartbeat batches. Every transaction that
	// sends a NOTIFY commits under one database-wide lock, so more
	// concurrent lock batches mostly queue there.
	lockWorkers      = 2
	heartbeatWorkers = 1
	// locksOfWorkers is how many LocksOf batches may be in flight at once.
	// A server over PostgreSQL reads a session's grants after every
	// heartbeat (C2 #ct2-confirm), so they come in the heartbeats' bursts.
	locksOfWorkers = 1
	// maxLockBatch and maxHeartbeatBatch bound the requests of one batch.
	// A lock batch holds one advisory lock per key it grants, from
	// PostgreSQL's shared lock table (max_locks_per_transaction per
	// connection, 64 by default), so it stays well below a few hundred.
	maxLockBatch      = 128
	maxHeartbeatBatch = 1000
	// maxLocksOfBatch bounds the sessions of one LocksOf batch, and so
	// (with lock.server.max-locks-per-session) the rows of its answer.
	maxLocksOfBatch = 256
	// batchTimeout bounds one batch (or the run of one of its requests
	// alone after the batch failed). It runs on a context of the Store, not
	// of any caller, so every request's outcome is known.
	batchTimeout = 10 * time.Second
)

// lockOp says what a lockReq does.
type lockOp int

const (
	opTry     lockOp = iota + 1 // TryInsert
	opWait                      // one attempt of Acquire: queue if busy
	opRelease                   // DeleteIfOwner
)

// lockReq is one grant attempt or release in a lock batch, with its result.
type lockReq struct {
	op    lockOp
	id    store.SessionID
	key   string
	token uint64 // opRelease
	keep  bool   // opWait: the caller's store.KeepPlace (a cut call keeps its queue place)
	nodl  bool   // opWait: the caller's store.NoDeadlockCheck, stored with the place

	out   outcome       // grants: granted, held, busy, dead; releases: freed, notOwned
	delay time.Duration // busy: a lock-delay keeps the free key this long (delay.go)
	g     store.Grant   // granted, held; freed: Key, Session, Token, AcquiredAt
	err   error         // classified
	// handed is, for a release (freed), the grant its commit made to the
	// key's first queued session (C2 #ct2-release-handover), if any.
	handed *store.Grant
}

// Outcomes of a release.
const (
	freed    outcome = iota + 10 // the grant was the current one and is gone
	notOwned                     // it was not (ErrNotOwner)
)

// raced is the outcome of a grant the batch could not decide: the key was
// free in the batch's snapshot but the INSERT found it taken (which the key
// locks rule out between grants; kept as a safe fallback). The request is
// then run alone, which reads the winner.
const raced outcome = 20

// startBatchers starts the group-commit workers. Each exits when its queue
// is closed (Close), after finishing the batch it is running.
func (s *Store) startBatchers() {
	s.lockQ = groupcommit.New[*lockReq](maxLockBatch, errClosed)
	s.hbQ = groupcommit.New[*hbReq](maxHeartbeatBatch, errClosed)
	s.locksQ = groupcommit.New[*locksReq](maxLocksOfBatch, errClosed)
	s.batchers.Add(lockWorkers + heartbeatWorkers + locksOfWorkers)
	for range lockWorkers {
		go s.lockWorker() // exits when s.lockQ is closed
	}
	for range heartbeatWorkers {
		go s.heartbeatWorker() // exits when s.hbQ is closed
	}
	for range locksOfWorkers {
		go s.locksOfWorker() // exits when s.locksQ is closed
	}
}

// stopBatchers answers every queued request with errClosed and waits for
// the batches in flight.
func (s *Store) stopBatchers() {
	s.lockQ.Close()
	s.hbQ.Close()
	s.locksQ.Close()
	s.batchers.Wait()
}

// doLock runs one grant attempt or release through the lock batches and
// returns its result. The error is the classified batch error, or the
// caller's context error (then nothing the request did survives: see
// undo).
func (s *Store) doLock(ctx context.Context, opName string, r *lockReq) (*lockReq, error) {
	j, err := s.lockQ.Submit(ctx, r.key, r)
	if err != nil {
		return nil, err
	}
	if ran, err := s.lockQ.Wait(ctx, j); err != nil {
		if ran {
			s.undo(r) // before the call returns (C2 #ct2-leave-after-cut)
		}
		return nil, result(ctx, opName, err)
	}
	return r, result(ctx, opName, r.err)
}

func (s *Store) lockWorker() {
	defer s.batchers.Done()
	for {
		batch := s.lockQ.Next()
		if batch == nil {
			return
		}
		reqs := groupcommit.Reqs(batch)
		sp := telemetry.StartCommit("pg", len(batch), groupcommit.Traced(batch)) // nil: untraced (C4 #ct4-traces)
		s.runLockBatch(reqs)
		sp.EndCommit(firstErr(reqs))
		handed := handOvers(reqs)
		s.lockQ.Finish(batch)   // a caller that gave up settles its request itself (doLock)
		s.tellHandOvers(handed) // committed, and the keys free for their next requests
	}
}

// runLockBatch runs reqs as one transaction and sets each one's result. If
// the transaction fails as a whole, each request runs alone, so that one
// request's failure is not its batch-mates'.
func (s *Store) runLockBatch(reqs []*lockReq) {
	s.metrics.Batch(telemetry.BatchLocks, len(reqs))
	if s.onLockBatch != nil {
		s.onLockBatch(reqs)
	}
	if hook := s.commitHook.Load(); hook != nil {
		keys := make([]string, len(reqs))
		for i, r := range reqs {
			keys[i] = r.key
		}
		(*hook)(keys)
	}
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	err := s.execLockBatch(ctx, reqs)
	cancel()
	for _, r := range reqs {
		if err != nil || r.out == raced {
			s.runAlone(r)
		}
	}
}

// execLockBatch runs the releases and grant attempts of reqs (distinct
// keys) in one pipelined implicit transaction: one round trip, one commit,
// and at most three statements (keyLock; releaseBatch with the releases'
// hand-over; grantBatch), so a lone grant or a lone release is two
// (TestLockPairStatements). The results are set only once the commit
// succeeded.
//
// Grants follow the same steps as grant (see there, and the reasoning on
// tokens), set-wise: keyLock takes the advisory lock of every key to grant,
// then one statement checks every session (locking live ones FOR KEY SHARE
// until commit), reads each key's holder and queue head, inserts the rows
// (with their tokens) of the keys that are free for their requester, queues
// busy waiters and dequeues waiters that got their key or whose session is
// dead.
func (s *Store) execLockBatch(ctx context.Context, reqs []*lockReq) error {
	var (
		b                    pgx.Batch
		relKeys, relSessions []string
		relTokens            []int64
		grKeys, grSessions   []string
		grWait, grNoDL       []bool
		rels, grants         []*lockReq
		relGone              []grantKey
	)
	for _, r := range reqs {
		if r.op == opRelease {
			rels = append(rels, r)
			relKeys, relSessions, relTokens = append(relKeys, r.key), append(relSessions, string(r.id)), append(relTokens, int64(r.token))
			relGone = append(relGone, grantKey{r.key, r.token})
		} else {
			grants = append(grants, r)
			grKeys, grSessions, grWait = append(grKeys, r.key), append(grSessions, string(r.id)), append(grWait, r.op == opWait)
			grNoDL = append(grNoDL, r.nodl)
		}
	}
	// Grants and releases take their keys' locks first, before this
	// transaction holds any row lock (the releases below), so that waiting
	// for a key lock never closes a cycle with a row lock. A release takes
	// its key's lock for its hand-over, which draws a token (see grant).
	if len(reqs) > 0 {
		b.Queue(s.q.keyLock, append(slices.Clone(grKeys), relKeys...))
	}
	released := make(map[string]time.Time)
	handed := make(map[string]*store.Grant)
	if len(rels) > 0 {
		s.queueReleases(&b, relKeys, relSessions, relTokens, released, handed) // handover.go
	}
	type check struct {
		remainingUS *int64
		holder      *string
		tok         *int64
		at          *time.Time
		newTok      *int64
		inserted    *time.Time
		eligible    bool
		multi       bool
		delayUS     *int64
	}
	checks := make([]check, len(grants))
	if len(grants) > 0 {
		b.Queue(s.q.grantBatch, grSessions, grKeys, grWait, grNoDL).Query(func(rows pgx.Rows) error {
			var i int
			var c check
			_, err := pgx.ForEachRow(rows, []any{&i, &c.remainingUS, &c.holder, &c.tok, &c.at, &c.newTok, &c.inserted, &c.eligible, &c.multi, &c.delayUS}, func() error {
				if i < 1 || i > len(checks) {
					return fmt.Errorf("grant batch returned row %d of %d", i, len(checks))
				}
				checks[i-1] = c
				return nil
			})
			return err
		})
	}
	// The releases are pending for the listener until their outcome is
	// known (gone.go).
	mark := s.gone.sending(relGone)
	if err := s.pool.SendBatch(ctx, &b).Close(); err != nil {
		s.gone.settle(relGone, mark, nil)
		return err
	}

	for _, r := range rels {
		if at, ok := released[r.key]; ok {
			r.out, r.g = freed, store.Grant{Key: r.key, Session: r.id, Token: r.token, AcquiredAt: at}
			r.handed = handed[r.key]
		} else {
			r.out = notOwned
		}
	}
	s.gone.settle(relGone, mark, func(i int) bool { return rels[i].out == freed })
	for i, r := range grants {
		c := checks[i]
		g := store.Grant{Key: r.key, Session: r.id}
		switch {
		case c.remainingUS == nil || *c.remainingUS <= 0:
			r.out = dead
			continue
		case c.holder != nil && *c.holder == string(r.id):
			g.Token, g.AcquiredAt = uint64(*c.tok), *c.at
			r.out = held
		case c.inserted != nil:
			g.Token, g.AcquiredAt = uint64(*c.newTok), *c.inserted
			r.out = granted
		case c.eligible:
			r.out = raced
			continue
		case c.multi && c.holder == nil:
			r.out = mismatch // a semaphore or read/write key (multi.go)
			continue
		default:
			r.out = busy
			if c.delayUS != nil {
				r.delay = time.Duration(*c.delayUS) * time.Microsecond
			}
			continue
		}
		g.Remaining = time.Duration(*c.remainingUS) * time.Microsecond
		r.g = g
	}
	return nil
}

// firstErr is the first request's error of a run batch, for its span.
func firstErr(reqs []*lockReq) error {
	for _, r := range reqs {
		if r.err != nil {
			return r.err
		}
	}
	return nil
}

// runAlone runs one request in a transaction of its own.
func (s *Store) runAlone(r *lockReq) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	r.out, r.g, r.delay, r.handed = 0, store.Grant{}, 0, nil // alone, a release hands over nothing: its waiters' notification does
	var err error
	if r.op == opRelease {
		var at time.Time
		err = s.inTx(ctx, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, s.q.release, r.key, string(r.id), int64(r.token)).Scan(&at)
		})
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			r.out, err = notOwned, nil
		case err == nil:
			r.out, r.g = freed, store.Grant{Key: r.key, Session: r.id, Token: r.token, AcquiredAt: at}
			s.gone.add(grantKey{r.key, r.token}) // committed (gone.go)
		}
	} else {
		err = s.inTx(ctx, func(tx pgx.Tx) (err error) {
			r.g, r.out, err = s.grant(ctx, tx, r.id, r.key, r.op == opWait, r.nodl)
			return err
		})
	}
	// Classified against a context that never ends: a timeout of the batch
	// is the backend's, never the caller's.
	r.err = classify(context.Background(), opTitle(r.op), err)
}

func opTitle(op lockOp) string {
	switch op {
	case opTry:
		return "try insert"
	case opWait:
		return "acquire"
	}
	return "release"
}

// undo reverts what a request did for a caller that gave up while its batch
// ran, before that caller returns (C2 #ct2-leave-after-cut): a waiter that
// was queued leaves the queue, unless the call keeps its place
// (store.KeepPlace, C2 #ct2-keep-place). Best effort, like leaveQueue. A grant is kept, as on etcd: the session holds the key and a
// retry of the call — through any instance — returns it (TryInsert and
// Acquire are idempotent for a key the session holds). Releasing it here
// would race that retry: another instance could hand the grant back to the
// client just before this release freed the key for someone else, leaving
// the client trusting a lock nobody protects (parity rolling-restart saw
// it). A grant nobody claims is released by the SDK from the heartbeat's
// held set (C2 #ct2-keep-place) or ends with the session.
func (s *Store) undo(r *lockReq) {
	if r.err == nil && r.out == busy && r.op == opWait && !r.keep {
		s.leaveQueue(r.id, r.key)
	}
}

// hbReq is one Heartbeat in a heartbeat batch, with its result.
type hbReq struct {
	id    store.SessionID
	live  bool
	ttlMS int64
	err   error // classified
}

func (s *Store) heartbeatWorker() {
	defer s.batchers.Done()
	for {
		batch := s.hbQ.Next()
		if batch == nil {
			return
		}
		s.runHeartbeatBatch(groupcommit.Reqs(batch))
		s.hbQ.Finish(batch) // a heartbeat leaves nothing to undo
	}
}

// runHeartbeatBatch extends every live session of reqs in one UPDATE (ids
// in order, so concurrent batches lock rows in one order) and sets each
// request's result.
func (s *Store) runHeartbeatBatch(reqs []*hbReq) {
	s.metrics.Batch(telemetry.BatchHeartbeats, len(reqs))
	ids := make([]string, 0, len(reqs))
	for _, r := range reqs {
		ids = append(ids, string(r.id))
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	ttls := make(map[string]int64, len(ids))
	rows, err := s.pool.Query(ctx, s.q.heartbeatBatch, ids)
	if err == nil {
		var id string
		var ttlMS int64
		_, err = pgx.ForEachRow(rows, []any{&id, &ttlMS}, func() error {
			ttls[id] = ttlMS
			return nil
		})
	}
	err = classify(context.Background(), "heartbeat", err)
	for _, r := range reqs {
		r.err = err
		if err == nil {
			r.ttlMS = ttls[string(r.id)]
			r.live = r.ttlMS > 0
		}
	}
}

// locksReq is one LocksOf in a read batch, with its result.
type locksReq struct {
	id     store.SessionID
	found  bool // the session's row exists
	live   bool // and has not expired
	grants []store.Grant
	err    error // classified
}

func (s *Store) locksOfWorker() {
	defer s.batchers.Done()
	for {
		batch := s.locksQ.Next()
		if batch == nil {
			return
		}
		s.runLocksOfBatch(groupcommit.Reqs(batch))
		s.locksQ.Finish(batch) // a read leaves nothing to undo
	}
}

// runLocksOfBatch reads the grants of every session of reqs in one SELECT
// and sets each request's result. The statement starts after every request
// of the batch was submitted (a batch is only taken from what is queued),
// so each request reads the grants committed before its call, as a query
// of its own would.
func (s *Store) runLocksOfBatch(reqs []*locksReq) {
	if s.onLocksOf != nil {
		s.onLocksOf(len(reqs))
	}
	ids := make([]string, 0, len(reqs))
	for _, r := range reqs {
		ids = append(ids, string(r.id))
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	type result struct {
		live   bool
		grants []store.Grant
	}
	found := make(map[string]*result, len(ids))
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, s.q.locksOfBatch, ids)
	if err == nil {
		var (
			id   string
			live bool
			key  *string
			tok  *int64
			at   *time.Time
		)
		_, err = pgx.ForEachRow(rows, []any{&id, &live, &key, &tok, &at}, func() error {
			res := found[id]
			if res == nil {
				res = &result{live: live, grants: []store.Grant{}}
				found[id] = res
			}
			if key != nil { // the LEFT JOIN found a lock
				res.grants = append(res.grants, store.Grant{Key: *key, Session: store.SessionID(id), Token: uint64(*tok), AcquiredAt: *at})
			}
			return nil
		})
	}
	err = classify(context.Background(), "locks of", err)
	for _, r := range reqs {
		r.err = err
		if res := found[string(r.id)]; err == nil && res != nil {
			// Each request gets a slice of its own (one session may be
			// asked for twice in a batch).
			r.found, r.live, r.grants = true, res.live, slices.Clone(res.grants)
		}
	}
}
