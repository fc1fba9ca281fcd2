package pgstore

import (
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/testing/pgtest"
)

// TestMigrationRace starts several instances on an empty database at once:
// the advisory lock makes exactly one apply the migrations.
func TestMigrationRace(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	const n = 4
	stores := make([]*Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			stores[i], errs[i] = New(testCtx(t), Options{DSN: dsn})
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("New #%d: %v", i, err)
		}
		defer stores[i].Close()
	}
	ms, err := loadMigrations()
	if err != nil {
		t.Fatalf("loadMigrations: %v", err)
	}
	var versions []int
	rows, err := stores[0].pool.Query(testCtx(t), "SELECT version FROM lockd.schema_migrations ORDER BY version")
	if err == nil {
		versions, err = pgx.CollectRows(rows, pgx.RowTo[int])
	}
	if err != nil {
		t.Fatalf("read schema_migrations: %v", err)
	}
	if len(versions) != len(ms) {
		t.Fatalf("schema_migrations %v, want versions 1..%d once each", versions, len(ms))
	}
	// All instances work on the one schema.
	id := openSession(t, stores[1])
	g := mustTry(t, stores[2], id, "k")
	if info, found, err := stores[3].Inspect(testCtx(t), "k"); err != nil || !found || info.Token != g.Token {
		t.Fatalf("Inspect = %+v, %v, %v", info, found, err)
	}
	// A schema newer than this code is refused.
	if _, err := stores[0].pool.Exec(testCtx(t), "INSERT INTO lockd.schema_migrations (version, name) VALUES ($1, 'future')", len(ms)+1); err != nil {
		t.Fatalf("insert future version: %v", err)
	}
	if s, err := New(testCtx(t), Options{DSN: dsn}); err == nil {
		s.Close()
		t.Fatal("New on a schema newer than the code succeeded")
	}
}
