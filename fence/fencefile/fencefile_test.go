//go:build unix

package fencefile_test

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"lock.dev/lockd/fence"
	"lock.dev/lockd/fence/fencefile"
	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

// TestWrite: equal and higher tokens replace the file; a stale token is a
// StaleError and leaves it untouched; another key's token is refused; a
// new Writer (another process) sees the mark.
func TestWrite(t *testing.T) {
	p := filepath.Join(t.TempDir(), "report.csv")
	for i, tok := range []uint64{7, 7, 9} {
		if err := fencefile.Write(p, "jobs/report", tok, []byte{byte('a' + i)}); err != nil {
			t.Fatalf("Write(token %d): %v", tok, err)
		}
	}
	err := fencefile.Writer{}.Write(p, "jobs/report", 8, []byte("stale"))
	var se *fence.StaleError
	if !errors.As(err, &se) || se.HighWater != 9 {
		t.Fatalf("Write(stale token 8) = %v; want a StaleError with high water 9", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "c" {
		t.Fatalf("file = %q after a stale write; want %q", b, "c")
	}
	if err := fencefile.Write(p, "other", 100, nil); !errors.Is(err, fencefile.ErrOtherKey) || !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Write(other key) = %v; want ErrOtherKey", err)
	}
	if err := fencefile.Write(p, "jobs/report", 0, nil); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Write(token 0) = %v; want ErrInvalid", err)
	}
}

// TestWriteRace: 16 writers with tokens 1…16 race; afterwards the file
// holds the highest accepted token's data and every refused write had a
// token below that mark.
func TestWriteRace(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	var wg sync.WaitGroup
	errs := make([]error, 17)
	for tok := 1; tok <= 16; tok++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs[tok] = fencefile.Write(p, "k", uint64(tok), []byte{byte(tok)}) }() // ends after one write
	}
	wg.Wait()
	b, err := os.ReadFile(p)
	if err != nil || len(b) != 1 || errs[16] != nil || b[0] != 16 {
		t.Fatalf("file = %v, %v (token 16's write: %v); want token 16's data", b, err, errs[16])
	}
	for tok, err := range errs[1:] {
		if err != nil && !errors.Is(err, fence.ErrStale) {
			t.Errorf("Write(token %d) = %v; want nil or ErrStale", tok+1, err)
		}
	}
}
