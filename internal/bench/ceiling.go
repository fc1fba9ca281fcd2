package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Names of the ceilings: what the device and the backend can commit at
// most, measured in the same run on the same data directory.
const (
	ceilFsync    = "fsync-4k"
	ceilEtcdPut  = "etcd-put"
	ceilPGInsert = "pg-insert"
)

// fsyncBlock is the size of one write of the fsync ceiling, and
// fsyncBlocks how many of them each writer's file cycles over (written and
// synced once before the clock starts, so that the loop overwrites
// allocated blocks, as a preallocated WAL segment does).
const (
	fsyncBlock  = 4 << 10
	fsyncBlocks = 16
)

// ceiling is one physical or backend limit, measured at each concurrency
// of the distinct scenario with the same warm-up and window.
type ceiling struct {
	name string
	// worker prepares worker i of a measurement and returns its operation
	// and the function that cleans up after it.
	worker func(ctx context.Context, tag string, i int) (op func(context.Context) error, done func(), err error)
	// prepare, if set, runs before the workers are made (for c workers)
	// and returns the function that undoes it after they finished.
	prepare func(ctx context.Context, c int) (func(), error)
}

// fsyncCeiling writes 4 KiB and fdatasyncs it, in a loop, each worker on a
// file of its own in dir.
func fsyncCeiling(dir string) ceiling {
	return ceiling{name: ceilFsync, worker: func(_ context.Context, tag string, i int) (func(context.Context) error, func(), error) {
		path := filepath.Join(dir, "lockd-bench-fsync-"+tag+"-"+strconv.Itoa(i))
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return nil, nil, fmt.Errorf("fsync ceiling: %w", err)
		}
		done := func() { _ = f.Close(); _ = os.Remove(path) }
		block := make([]byte, fsyncBlock)
		for b := range fsyncBlocks {
			if _, err := f.WriteAt(block, int64(b)*fsyncBlock); err != nil {
				done()
				return nil, nil, fmt.Errorf("fsync ceiling: %w", err)
			}
		}
		if err := f.Sync(); err != nil {
			done()
			return nil, nil, fmt.Errorf("fsync ceiling: %w", err)
		}
		n := 0
		op := func(context.Context) error {
			block[0] = byte(n)
			if _, err := f.WriteAt(block, int64(n%fsyncBlocks)*fsyncBlock); err != nil {
				return err
			}
			n++
			return fdatasync(f)
		}
		return op, done, nil
	}}
}

// etcdPutCeiling puts a key of the worker's own, in a loop: one etcd
// commit each, through the baselines' client.
func etcdPutCeiling(cli *clientv3.Client, prefix string) ceiling {
	return ceiling{name: ceilEtcdPut, worker: func(_ context.Context, tag string, i int) (func(context.Context) error, func(), error) {
		key := prefix + tag + "/w" + strconv.Itoa(i)
		op := func(ctx context.Context) error {
			_, err := cli.Put(ctx, key, "x")
			return err
		}
		return op, func() {}, nil
	}}
}

// pgInsertCeiling inserts one row into a table without indexes, in a
// loop, each worker in autocommit on a connection of its own (a pool of
// exactly c connections, opened before the clock starts).
func pgInsertCeiling(base *pgxpool.Config, schema string) ceiling {
	insert := `INSERT INTO ` + pgx.Identifier{schema}.Sanitize() + `.ceiling (id) VALUES ($1)`
	var pool *pgxpool.Pool
	return ceiling{
		name: ceilPGInsert,
		prepare: func(ctx context.Context, c int) (func(), error) {
			p, err := openWarmPool(ctx, base, c)
			if err != nil {
				return nil, fmt.Errorf("pg insert ceiling: %w", err)
			}
			pool = p
			return func() { pool = nil; p.Close() }, nil
		},
		worker: func(_ context.Context, _ string, i int) (func(context.Context) error, func(), error) {
			p := pool
			op := func(ctx context.Context) error {
				_, err := p.Exec(ctx, insert, i)
				return err
			}
			return op, func() {}, nil
		},
	}
}

// pgCeilingDDL creates the table of pgInsertCeiling in schema.
func pgCeilingDDL(schema string) string {
	return `CREATE TABLE ` + pgx.Identifier{schema}.Sanitize() + `.ceiling (id bigint NOT NULL)`
}

// measureCeiling runs c workers of ce, each calling its operation in a
// loop: for the warm-up of dur, then for dur. The window ends when the
// last worker finished its last operation.
func measureCeiling(ctx context.Context, ce ceiling, c int, dur time.Duration, tag string) (loadResult, error) {
	if ce.prepare != nil {
		done, err := ce.prepare(ctx, c)
		if err != nil {
			return loadResult{}, err
		}
		defer done()
	}
	ops := make([]func(context.Context) error, c)
	var dones []func()
	defer func() {
		for _, d := range dones {
			d()
		}
	}()
	for i := range c {
		op, done, err := ce.worker(ctx, tag, i)
		if err != nil {
			return loadResult{}, err
		}
		ops[i], dones = op, append(dones, done)
	}
	run := func(dur time.Duration) (loadResult, error) {
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		counts := make([]int, c)
		start := time.Now()
		deadline := start.Add(dur)
		var wg sync.WaitGroup
		for i, op := range ops {
			wg.Add(1)
			go func() { // exits at the deadline or on the first error
				defer wg.Done()
				for time.Now().Before(deadline) {
					if err := op(ctx); err != nil {
						cancel(fmt.Errorf("%s worker %d: %w", ce.name, i, err))
						return
					}
					counts[i]++
				}
			}()
		}
		wg.Wait()
		if err := context.Cause(ctx); err != nil {
			return loadResult{}, err
		}
		res := loadResult{elapsed: time.Since(start), perClient: counts}
		for _, n := range counts {
			res.ops += n
		}
		return res, nil
	}
	if _, err := run(warmupFor(dur)); err != nil {
		return loadResult{}, fmt.Errorf("warm-up: %w", err)
	}
	return run(dur)
}
