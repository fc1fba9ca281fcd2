// Package fencepg is the lockd fence for PostgreSQL (C2 #ct2-fence-kit):
// SQL (the lockd_fence table, the function lockd_fence_check and the
// trigger function lockd_fence_row) that refuses a write carrying a
// fencing token lower than the highest accepted for its key with SQLSTATE
// LF409, and helpers for pgx v5.
//
// Apply the SQL once (Apply, or psql -f lockd_fence.sql), then call Check
// in every transaction that writes under a lock, before or after the
// write: a stale token makes Check return a *fence.StaleError and aborts
// the transaction, so the write never commits.
//
//	tx, _ := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	if err := fencepg.Check(ctx, tx, lock.Key(), lock.Token()); err != nil {
//		return err // errors.Is(err, fence.ErrStale): a newer holder wrote
//	}
//	tx.Exec(ctx, "UPDATE accounts SET ...")
//	tx.Commit(ctx)
package fencepg

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"lock.dev/lockd/fence"
)

// SQL is lockd_fence.sql: the table, lockd_fence_check and lockd_fence_row.
//
//go:embed lockd_fence.sql
var SQL string

// StaleCode is the SQLSTATE lockd_fence_check raises for a stale token.
const StaleCode = "LF409"

// Execer is what runs a statement: pgx.Tx, *pgx.Conn and *pgxpool.Pool.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Apply runs SQL on db (idempotent) as one statement batch, in one
// transaction holding an advisory lock, so concurrent Applies do not race
// on CREATE TABLE and CREATE OR REPLACE.
func Apply(ctx context.Context, db Execer) error {
	if _, err := db.Exec(ctx, "SELECT pg_advisory_xact_lock(7420409);\n"+SQL); err != nil {
		return fmt.Errorf("fencepg: apply: %w", err)
	}
	return nil
}

// Fence checks tokens with lockd_fence_check and counts refusals.
type Fence struct {
	// Metrics, if set, counts refused writes (resource "postgres").
	Metrics *fence.Metrics
}

// Check runs lockd_fence_check(key, token) on q, normally the transaction
// that writes: nil when the token is at or above the key's mark (raised
// to it, the row locked until q's transaction ends), a *fence.StaleError
// when it is below (the transaction is then aborted), fence.ErrInvalid for
// bad input, any other error as it came.
func (f Fence) Check(ctx context.Context, q Execer, key string, token uint64) error {
	if err := fence.Validate(key, token); err != nil {
		return err
	}
	_, err := q.Exec(ctx, "SELECT lockd_fence_check($1, $2)", key, int64(token))
	if err == nil {
		return nil
	}
	if se := staleError(err, key, token); se != nil {
		f.Metrics.Refused(fence.ResourcePostgres)
		return se
	}
	return fmt.Errorf("fencepg: check %q: %w", key, err)
}

// Check is Fence{}.Check: without metrics.
func Check(ctx context.Context, q Execer, key string, token uint64) error {
	return Fence{}.Check(ctx, q, key, token)
}

// IsStale reports whether err is the fence's refusal (SQLSTATE LF409),
// from Check or from a write that fired a lockd_fence_row trigger, and
// returns it as a *fence.StaleError (key and token from the error's
// detail).
func IsStale(err error) (*fence.StaleError, bool) {
	se := staleError(err, "", 0)
	return se, se != nil
}

// staleError maps LF409 to a *fence.StaleError; nil for any other error.
func staleError(err error, key string, token uint64) *fence.StaleError {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != StaleCode {
		return nil
	}
	se := &fence.StaleError{Key: key, Token: token}
	// DETAIL: key '<key>' token <t> high_water <h> (lockd_fence.sql).
	f := strings.Fields(pe.Detail)
	if n := len(f); n >= 5 && f[n-2] == "high_water" && f[n-4] == "token" {
		se.HighWater, _ = strconv.ParseUint(f[n-1], 10, 64)
		if se.Token == 0 {
			se.Token, _ = strconv.ParseUint(f[n-3], 10, 64)
		}
		if se.Key == "" {
			k := strings.TrimSuffix(strings.TrimPrefix(pe.Detail, "key '"), fmt.Sprintf("' token %s high_water %s", f[n-3], f[n-1]))
			se.Key = strings.ReplaceAll(k, "''", "'")
		}
	}
	return se
}

// Store is a fence.Store on the lockd_fence table (apply SQL first): each
// Advance is one statement of its own.
type Store struct {
	db Execer
}

var _ fence.Store = (*Store)(nil)

// NewStore returns a Store on db (a *pgxpool.Pool, normally).
func NewStore(db Execer) *Store { return &Store{db: db} }

// Advance implements fence.Store.
func (s *Store) Advance(ctx context.Context, key string, token uint64) error {
	return Check(ctx, s.db, key, token)
}
