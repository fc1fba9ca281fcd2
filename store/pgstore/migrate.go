package pgstore

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/lockd/internal/telemetry"
)

// migrationFiles are the schema migrations, NNNN_name.sql, applied in order.
// A released migration is never edited; a change is a new file.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// loadMigrations reads the embedded migrations; their versions must be 1..n
// without gaps.
func loadMigrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || !strings.HasSuffix(name, ".sql") {
			return nil, fmt.Errorf("migration file %q is not named NNNN_name.sql", name)
		}
		b, err := migrationFiles.ReadFile(path.Join("migrations", name))
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: name, sql: string(b)})
	}
	for i, m := range ms { // ReadDir sorts by name
		if m.version != i+1 {
			return nil, fmt.Errorf("migration %s: version %d, want %d", m.name, m.version, i+1)
		}
	}
	return ms, nil
}

// migrate brings the schema up to date in one transaction. The transaction
// first takes an advisory lock keyed by the schema name, so replicas that
// start at the same time apply each migration exactly once: the second
// waits, then finds the work done. A database whose schema is newer than
// this binary knows is refused rather than used.
func migrate(ctx context.Context, pool *pgxpool.Pool, schema, channel string) error {
	ms, err := loadMigrations()
	if err != nil {
		return fmt.Errorf("load migrations: %w", err)
	}
	qs := pgx.Identifier{schema}.Sanitize()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", "lockd.migrate:"+schema); err != nil {
			return err
		}
		// Read the version first, so that an up-to-date schema needs no DDL
		// (and New works, read-only, on a standby).
		var current int
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", qs+".schema_migrations").Scan(&exists); err != nil {
			return err
		}
		if exists {
			if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+qs+".schema_migrations").Scan(&current); err != nil {
				return err
			}
		}
		switch {
		case current > len(ms):
			return fmt.Errorf("schema %s is at version %d, newer than this lockd knows (%d)", schema, current, len(ms))
		case current == len(ms):
			return nil
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+qs); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+qs+`.schema_migrations (
			version    int         PRIMARY KEY,
			name       text        NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		for _, m := range ms[current:] {
			sql := strings.NewReplacer("{{schema}}", qs, "{{channel}}", quoteLiteral(channel)).Replace(m.sql)
			if _, err := tx.Exec(ctx, sql); err != nil {
				return fmt.Errorf("apply %s: %w", m.name, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+qs+".schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name); err != nil {
				return err
			}
		}
		return nil
	})
}

// applyMigrations runs migrate on s's pool and schema, observed as one
// request.
func (s *Store) applyMigrations(ctx context.Context) (err error) {
	defer s.metrics.Observe(telemetry.OpMigrate)(&err)
	return classify(ctx, "migrate", migrate(ctx, s.pool, s.schema, s.channel))
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
