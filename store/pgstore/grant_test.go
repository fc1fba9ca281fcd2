package pgstore

import (
	"fmt"
	"sync"
	"testing"

	"lock.dev/lockd/internal/testing/pgtest"
)

// TestTokensIncreaseUnderContention has many sessions on two instances take
// one key in turns; each holder records its token while it holds the key,
// so the record is in grant order and must be strictly increasing.
func TestTokensIncreaseUnderContention(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	insts := []*Store{newStore(t, dsn), newStore(t, dsn)}
	const workers, rounds = 8, 10
	var (
		mu     sync.Mutex
		tokens []uint64
		wg     sync.WaitGroup
		errs   = make(chan error, workers)
	)
	for i := range workers {
		st := insts[i%2]
		id := openSession(t, st)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				g, err := st.Acquire(testCtx(t), id, "contended")
				if err != nil {
					errs <- fmt.Errorf("Acquire: %w", err)
					return
				}
				mu.Lock()
				tokens = append(tokens, g.Token)
				mu.Unlock()
				if err := st.DeleteIfOwner(testCtx(t), id, "contended", g.Token); err != nil {
					errs <- fmt.Errorf("DeleteIfOwner: %w", err)
					return
				}
				if _, err := st.Heartbeat(testCtx(t), id); err != nil {
					errs <- fmt.Errorf("Heartbeat: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(tokens) != workers*rounds {
		t.Fatalf("%d grants, want %d", len(tokens), workers*rounds)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("grant %d has token %d after %d: not strictly increasing (%v)", i, tokens[i], tokens[i-1], tokens)
		}
	}
}
