package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/store"
)

var _ store.DeadlockScanGater = (*Store)(nil)

// SetDeadlockScanGate is store.DeadlockScanGater (tests, C2
// #ct2-deadlock "Test hook").
func (s *Store) SetDeadlockScanGate(gate func(ctx context.Context)) { s.deadlocks.SetGate(gate) }

// waitGraph reads the wait-for graph (C2 #ct2-deadlock) for the deadlock
// detector: every waiter and grant, plain (waiters, locks) and semaphore or
// read/write (slot_waiters, slots), in one statement (one snapshot). A
// waiter's Seq is its row id, its place in FIFO order; both waiter tables
// draw ids from one sequence (migration 0014), so Seq orders every place
// by age.
func (s *Store) waitGraph(ctx context.Context) (g store.WaitGraph, err error) {
	rows, err := s.pool.Query(ctx, s.q.waitGraph)
	if err != nil {
		return g, classify(ctx, "deadlock scan", err)
	}
	var (
		isWait, nodl bool
		key, sid     string
		id           int64
		mode         int16
		lim          int32
	)
	_, err = pgx.ForEachRow(rows, []any{&isWait, &key, &sid, &id, &nodl, &mode, &lim}, func() error {
		if isWait {
			g.Waits = append(g.Waits, store.Wait{Session: store.SessionID(sid), Key: key, Seq: id, NoCheck: nodl,
				Limit: uint32(max(lim, 0)), Mode: store.Mode(mode)})
		} else {
			g.Holds = append(g.Holds, store.Hold{Session: store.SessionID(sid), Key: key, Mode: store.Mode(mode)})
		}
		return nil
	})
	if err != nil {
		return store.WaitGraph{}, classify(ctx, "deadlock scan", err)
	}
	return g, nil
}
