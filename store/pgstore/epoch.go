package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Tokens across a re-initialised backend (C2 #ct2-fencing). A token is a
// value of the schema's fencing_token sequence, stored in the lock row, so
// nothing converts it; instead the sequence itself is raised to at least
// lockd's wall clock in microseconds whenever a Store opens and whenever it
// opens a new connection of its own pool. A new schema or database starts
// its sequence at 1, a promoted asynchronous replica may hold an older
// value: either way the sequence is raised before the Store draws a token
// from it, above every token issued before (those were at most the
// wall-clock µs at which they were issued, as long as tokens were drawn at
// under 10⁶ a second on average). Older lockd replicas sharing the schema
// draw from the same raised sequence.
//
// The raise holds the sequence's lock: a no-op ALTER SEQUENCE takes a lock
// that conflicts with nextval's, so it waits for every transaction that has
// drawn a token and keeps new draws out until it commits; setval under it
// cannot overwrite a value drawn meanwhile. It never lowers the sequence.

// raiseLockTimeout bounds how long a raise waits for transactions that
// drew a token to end.
const raiseLockTimeout = 5 * time.Second

// raiseTokens raises the sequence seq (quoted, schema-qualified) on conn to
// at least now in µs. On a read-only server (a standby) it does nothing: no
// token can be drawn there either. missingOK also accepts a sequence that
// does not exist yet (a connection made before the migrations ran).
func raiseTokens(ctx context.Context, conn *pgx.Conn, seq string, now time.Time, missingOK bool) error {
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", raiseLockTimeout.Milliseconds())); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "ALTER SEQUENCE "+seq+" NO CYCLE"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT setval($1::regclass, $2) FROM "+seq+" WHERE last_value < $2", seq, now.UnixMicro())
		return err
	})
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "25006" || missingOK && (pe.Code == "42P01" || pe.Code == "3F000")) {
		return nil // read_only_sql_transaction; undefined_table, invalid_schema_name
	}
	return err
}

// raiseTokensOnOpen raises the sequence at New, after the migrations.
func (s *Store) raiseTokensOnOpen(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return classify(ctx, "raise tokens", err)
	}
	defer conn.Release()
	if err := raiseTokens(ctx, conn.Conn(), s.seqIdent(), time.Now(), false); err != nil {
		return classify(ctx, "raise tokens", err)
	}
	return nil
}

// seqIdent is the quoted name of the fencing-token sequence.
func (s *Store) seqIdent() string { return seqIdent(s.schema) }

func seqIdent(schema string) string { return pgx.Identifier{schema, "fencing_token"}.Sanitize() }
