package bench

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/client"
)

// The semaphore scenario (issue #15 §3): c clients loop taking one of the N
// slots of one counting semaphore, holding it semHold, and freeing it. Per
// system:
//
//   - acquisitions/s: slots granted in the window;
//   - wait p50/p99: from the start of the take until it returned;
//   - fairness: max/min of the acquisitions per client;
//   - most holders at once: the most clients holding a slot at one moment
//     (from the take's return to the start of its release). More than N
//     fails the measurement (TestSemaphoreLoad has that control).
//
// Systems take part through semaphorer and slotHolder, like the election's
// elector and candidate.

// semaphorer is a system with counting semaphores.
type semaphorer interface {
	name() string
	// slotHolder opens a client of its own: a session, lease or sessions
	// row.
	slotHolder(ctx context.Context) (slotHolder, error)
}

// slotHolder is one client of a semaphorer.
type slotHolder interface {
	// takeSlot waits for one of the n slots of sem and returns the
	// function that frees it.
	takeSlot(ctx context.Context, sem string, n int) (release func(context.Context) error, err error)
	close(ctx context.Context) error
}

// scSemaphore is the semaphore scenario; sysEtcdSem and sysPGSem its raw
// baselines (neither etcd's concurrency package nor PostgreSQL has a
// semaphore).
const (
	scSemaphore = "semaphore"
	sysEtcdSem  = "etcd-sem"
	sysPGSem    = "pg-sem"
)

// semHold is how long a client holds its slot: the work a slot admits.
// Holders then overlap, so that "most holders at once" shows the semaphore
// full (N) and the safety check can see an N+1st; it caps a system at
// N/semHold acquisitions/s, far above what any of them reaches here.
const semHold = time.Millisecond

// semaphoreNote explains the semaphore rows.
var semaphoreNote = "semaphore: c clients loop: take one of the N slots of one semaphore (N in the settings), hold it " + semHold.String() +
	", free it; wait = take start -> take returns; most holders = the most clients between take's return and release's start at one moment " +
	"(more than N fails the run); lockd = Session.Acquire with client.WithLimit(N); etcd-sem = raw etcd N-slot recipe " +
	"(etcd's concurrency package has no semaphore); pg-sem = N slot rows taken with FOR UPDATE SKIP LOCKED, polled every 2-10 ms"

func (r *runner) semaphore(ctx context.Context) ([]Row, error) {
	var rows []Row
	n := r.cfg.SemaphoreLimit
	for _, c := range r.cfg.SemaphoreConcurrency {
		var entries []entry
		for _, sm := range r.bed.semaphorers {
			entries = append(entries, entry{sm.name(), func(ctx context.Context, round int) (loadResult, string, error) {
				tag := fmt.Sprintf("semaphore-c%d-r%d", c, round)
				lr, err := r.cell(ctx, scSemaphore, sm, c, tag, func(ctx context.Context) (loadResult, error) {
					return measureSemaphore(ctx, sm, c, n, r.cfg.Duration, tag)
				})
				wait := sortedLatencies([]loadResult{lr})
				return lr, fmt.Sprintf("%s acquisitions/s  wait p50 %s ms  fairness %s  most holders %d of %d",
					lr.rate(), percentile(wait, 50), fairness(lr.perClient), lr.most, n), err
			}})
		}
		res, err := r.rounds(ctx, fmt.Sprintf("semaphore c=%d N=%d", c, n), entries)
		if err != nil {
			return rows, err
		}
		lockd := res[sysLockd]
		for _, sm := range r.bed.semaphorers[1:] {
			name := sm.name()
			raw := res[name]
			lr, rr := rates(lockd), rates(raw)
			acq := compare(scSemaphore, c, MetricAcquisitionsPerSec, name, median(lr), median(rr))
			acq.LockdRounds, acq.RawRounds = lr, rr
			p50 := compare(scSemaphore, c, MetricWaitP50, name, percentile(sortedLatencies(lockd), 50), percentile(sortedLatencies(raw), 50))
			p99 := compare(scSemaphore, c, MetricWaitP99, name, percentile(sortedLatencies(lockd), 99), percentile(sortedLatencies(raw), 99))
			lf, rf := fairnesses(lockd), fairnesses(raw)
			fair := compare(scSemaphore, c, MetricFairness, name, median(lf), median(rf))
			fair.LockdRounds, fair.RawRounds = lf, rf
			lm, rm := mosts(lockd), mosts(raw)
			most := compare(scSemaphore, c, MetricMostHolders, name, slices.Max(lm), slices.Max(rm))
			most.LockdRounds, most.RawRounds = lm, rm
			for _, row := range []*Row{&acq, &p50, &p99, &fair, &most} {
				row.Note = semaphoreNote
			}
			rows = append(rows, acq, p50, p99, fair, most)
		}
		var names []string
		for _, sm := range r.bed.semaphorers {
			names = append(names, sm.name())
		}
		rows = append(rows, cpuRows(scSemaphore, c, res, names, "", 0)...)
	}
	return rows, nil
}

func mosts(rs []loadResult) []Value {
	var vs []Value
	for _, r := range rs {
		vs = append(vs, Value(r.most))
	}
	return vs
}

// measureSemaphore opens c clients of sm, runs the semaphore load on them,
// closes them and returns the result.
func measureSemaphore(ctx context.Context, sm semaphorer, c, n int, dur time.Duration, tag string) (loadResult, error) {
	return measureClients(ctx, sm, c, "clients", sm.slotHolder, func(ctx context.Context, holders []slotHolder) (loadResult, error) {
		hold := func(ctx context.Context) error { return sleep(ctx, semHold) }
		return semaphoreLoad(ctx, holders, n, hold, warmupFor(dur), dur, tag)
	})
}

// slotGrant is one slot a client got.
type slotGrant struct {
	at   time.Time     // takeSlot returned
	wait time.Duration // since takeSlot was called
}

// semaphoreLoad has every client loop: take a slot of one semaphore of n,
// hold it (hold), free it. The window opens at the first grant after warm
// and lasts dur; waiting takes are then cancelled. It counts the clients
// between a take's return and the start of its release, and fails when
// that is ever more than n.
func semaphoreLoad(ctx context.Context, holders []slotHolder, n int, hold func(context.Context) error, warm, dur time.Duration, tag string) (loadResult, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	wctx, wcancel := context.WithCancel(ctx) // ends the taking after the window
	defer wcancel()
	sem := tag + "/sem"
	start := time.Now()
	warmEnd := start.Add(warm)
	win := startWindow(ctx, cancel, wcancel, dur, "grant")

	var inside, most atomic.Int64 // clients holding a slot now, and at most
	grants := make([][]slotGrant, len(holders))
	var wg sync.WaitGroup
	for ci, h := range holders {
		wg.Add(1)
		go func() { // exits when the window ends or on the first error
			defer wg.Done()
			for wctx.Err() == nil {
				t0 := time.Now()
				release, err := h.takeSlot(wctx, sem, n)
				if err != nil {
					if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
						// The server may report the end a moment before
						// this process's context shows it.
						select {
						case <-wctx.Done():
						case <-time.After(time.Second):
						}
					}
					if wctx.Err() != nil && ctx.Err() == nil {
						return // the window ended while waiting
					}
					cancel(fmt.Errorf("client %d take: %w", ci, err))
					return
				}
				at := time.Now()
				k := inside.Add(1)
				for m := most.Load(); k > m && !most.CompareAndSwap(m, k); m = most.Load() {
				}
				if k > int64(n) {
					cancel(fmt.Errorf("%d holders of a semaphore of %d at once (client %d just took a slot)", k, n, ci))
					return
				}
				if !at.Before(warmEnd) {
					win.open(ctx, at)
				}
				grants[ci] = append(grants[ci], slotGrant{at: at, wait: at.Sub(t0)})
				herr := hold(wctx)
				inside.Add(-1)
				if err := release(ctx); err != nil {
					cancel(fmt.Errorf("client %d release: %w", ci, err))
					return
				}
				if herr != nil && wctx.Err() == nil {
					cancel(fmt.Errorf("client %d hold: %w", ci, herr))
					return
				}
			}
		}()
	}
	wg.Wait()
	<-win.done
	windowStart, end := win.start, win.end
	if err := context.Cause(ctx); err != nil {
		return loadResult{}, err
	}
	res := loadResult{elapsed: end.Sub(windowStart), perClient: make([]int, len(holders)), most: int(most.Load())}
	for ci, gs := range grants {
		for _, g := range gs {
			if !g.at.Before(windowStart) && g.at.Before(end) {
				res.perClient[ci]++
				res.lat = append(res.lat, g.wait)
			}
		}
		res.ops += res.perClient[ci]
	}
	return res, nil
}

// ---- lockd ----

func (s *lockdSystem) slotHolder(ctx context.Context) (slotHolder, error) {
	l, err := s.open(ctx)
	if err != nil {
		return nil, err
	}
	return l.(lockdLocker), nil
}

func (l lockdLocker) takeSlot(ctx context.Context, sem string, n int) (func(context.Context) error, error) {
	lk, err := l.s.Acquire(ctx, sem, client.WithLimit(uint32(n)))
	if err != nil {
		return nil, err
	}
	return lk.Release, nil
}

// ---- raw etcd ----

// etcdSemSystem is the raw etcd semaphore: etcdTxnSystem's leases with the
// N-slot recipe (takeSlot) under a prefix of its own.
type etcdSemSystem struct{ etcdTxnSystem }

func (s *etcdSemSystem) name() string { return sysEtcdSem }

func (s *etcdSemSystem) slotHolder(ctx context.Context) (slotHolder, error) {
	l, err := s.open(ctx)
	if err != nil {
		return nil, err
	}
	return l.(*etcdTxnLocker), nil
}

// semLeaveTimeout bounds deleting the waiter key of a take that failed.
const semLeaveTimeout = 5 * time.Second

// takeSlot is the well-known N-slot recipe on raw etcd: the client puts
// its waiter key sem/<lease> on its lease (a retry finds it again) and
// holds a slot while fewer than n keys of sem were created before it (by
// create revision). Otherwise it watches sem/ for deletes, reads the keys
// ahead of it once the watch is established — a set that can only shrink,
// since later keys have higher create revisions — and waits until fewer
// than n are left. Freeing the slot deletes the key. A take that fails or
// is cancelled deletes its key, leaving the queue.
//
// The watch starts at the current revision and the read comes after it:
// a watch from a past revision (the read's, as concurrency.Mutex and
// Election do) is an unsynced watcher that etcd serves every 100 ms under
// churn, which a careful recipe avoids.
func (l *etcdTxnLocker) takeSlot(ctx context.Context, sem string, n int) (func(context.Context) error, error) {
	cli := l.sys.cli
	dir := l.sys.prefix + sem + "/"
	k := dir + strconv.FormatInt(int64(l.lease), 16)
	release := func(ctx context.Context) error {
		for {
			_, err := cli.Delete(ctx, k)
			if !l.sys.retried(ctx, err) {
				return err
			}
		}
	}
	var mine int64 // our key's create revision: our place in the queue
	for mine == 0 {
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, "", clientv3.WithLease(l.lease))).
			Else(clientv3.OpGet(k)).
			Commit()
		if l.sys.retried(ctx, err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if resp.Succeeded {
			mine = resp.Header.Revision
		} else if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			mine = kvs[0].CreateRevision // put by an earlier attempt whose answer was lost
		}
	}
	admitted := false
	defer func() {
		if !admitted {
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), semLeaveTimeout)
			defer cancel()
			_ = release(lctx)
		}
	}()
	ahead := func() (map[string]bool, error) { // the keys ahead of ours
		for {
			resp, err := cli.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(mine-1))
			if l.sys.retried(ctx, err) {
				continue
			}
			if err != nil {
				return nil, err
			}
			set := make(map[string]bool, len(resp.Kvs))
			for _, kv := range resp.Kvs {
				set[string(kv.Key)] = true
			}
			return set, nil
		}
	}
	for {
		set, err := ahead()
		if err != nil {
			return nil, err
		}
		if len(set) >= n {
			err = waitFewer(ctx, cli, dir, ahead, n)
			if l.sys.retried(ctx, err) {
				continue // read the keys ahead again
			}
			if err != nil {
				return nil, err
			}
		}
		admitted = true
		return release, nil
	}
}

// waitFewer watches the deletes under dir from now, reads the keys ahead
// once the watch is established, and returns when fewer than n of them are
// left.
func waitFewer(ctx context.Context, cli *clientv3.Client, dir string, read func() (map[string]bool, error), n int) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ahead map[string]bool // nil until the watch is established
	for wr := range cli.Watch(wctx, dir, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify()) {
		if err := wr.Err(); err != nil {
			return err
		}
		if wr.Created {
			var err error
			if ahead, err = read(); err != nil {
				return err
			}
		}
		for _, ev := range wr.Events {
			delete(ahead, string(ev.Kv.Key))
		}
		if ahead != nil && len(ahead) < n {
			return nil
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("watch closed")
}

// ---- raw PostgreSQL ----

// slotHolder opens a pg-raw client of the pg-sem system (a sessions row).
func (s *pgRawSystem) slotHolder(ctx context.Context) (slotHolder, error) {
	if s.minimal {
		return nil, fmt.Errorf("%s has no sessions", s.sysName)
	}
	l, err := s.open(ctx)
	if err != nil {
		return nil, err
	}
	return l.(*pgRawLocker), nil
}

// takeSlot takes a free one of sem's n slot rows (made on first use, ON
// CONFLICT DO NOTHING) in one autocommit UPDATE whose subquery locks it
// with FOR UPDATE SKIP LOCKED, so that concurrent takers never block on
// each other or take one row twice; the token comes from the sequence. No
// free slot: poll again in 2-10 ms. A session's death frees its slots (ON
// DELETE SET NULL).
func (l *pgRawLocker) takeSlot(ctx context.Context, sem string, n int) (func(context.Context) error, error) {
	pool := l.pool
	if !l.made[sem] {
		if _, err := pool.Exec(ctx, l.sys.q.makeSlots, sem, n); err != nil {
			return nil, fmt.Errorf("make %d slots: %w", n, err)
		}
		if l.made == nil {
			l.made = map[string]bool{}
		}
		l.made[sem] = true
	}
	for {
		var slot, token int64
		err := pool.QueryRow(ctx, l.sys.q.takeSlot, sem, l.id).Scan(&slot, &token)
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
			tag, err := pool.Exec(ctx, l.sys.q.freeSlot, sem, slot, token)
			if err == nil && tag.RowsAffected() != 1 {
				err = fmt.Errorf("free %q slot %d token %d: not held", sem, slot, token)
			}
			return err
		}, nil
	}
}
