package runner

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/lockd/fence/fencepg"
)

// fencePGTimeout bounds connecting to the fence's database and applying
// the fence.
const fencePGTimeout = 30 * time.Second

// startFencePG gives the fenced resource the shipped PostgreSQL fence
// (fence/fencepg, issue 26): a fresh database on the shared PostgreSQL
// server — never one a scenario restarts (those run on a private server,
// privatePG) — with lockd_fence applied. The fenced resource then checks
// plain writes with lockd_fence_check; the pool is closed in teardown.
func (r *run) startFencePG() (*pgxpool.Pool, error) {
	srv, db, err := r.env.sharedDB()
	if err != nil {
		return nil, fmt.Errorf("fence database: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), fencePGTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, srv.DSN(db))
	if err != nil {
		return nil, fmt.Errorf("fence database: %w", err)
	}
	if err := fencepg.Apply(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("fence database: %w", err)
	}
	return pool, nil
}
