package tlsreload_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/internal/tlsreload"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

// TestReloader: Current re-loads only when a file's modification time or
// size changed; a version that fails keeps the previous value and is
// logged once; Reload re-loads unconditionally.
func TestReloader(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	at := time.Unix(1_700_000_000, 0)
	write := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, at, at); err != nil { // a fixed time: only the size tells versions apart
			t.Fatal(err)
		}
	}
	write(a, "1")
	write(b, "x")
	loads := 0
	load := func() (string, error) {
		loads++
		ca, err := os.ReadFile(a)
		if err != nil {
			return "", err
		}
		if string(ca) == "bad" {
			return "", errors.New("test.a-file: bad content")
		}
		cb, err := os.ReadFile(b)
		return string(ca) + string(cb), err
	}
	logger, logs := testkit.NewLogger()
	r, err := tlsreload.New("grpc", []string{a, "", b}, load, logger)
	if err != nil {
		t.Fatal(err)
	}
	check := func(want string, wantLoads, wantOK, wantFailed int) {
		t.Helper()
		if got := r.Current(); got != want {
			t.Errorf("Current() = %q, want %q", got, want)
		}
		if loads != wantLoads {
			t.Errorf("loads = %d, want %d", loads, wantLoads)
		}
		if n := len(logs.Events("tls_reloaded")); n != wantOK {
			t.Errorf("tls_reloaded logged %d times, want %d:\n%s", n, wantOK, logs)
		}
		if n := len(logs.Events("tls_reload_failed")); n != wantFailed {
			t.Errorf("tls_reload_failed logged %d times, want %d:\n%s", n, wantFailed, logs)
		}
	}
	check("1x", 1, 0, 0) // unchanged: no load
	write(b, "yy")       // the second file's size changed
	check("1yy", 2, 1, 0)
	check("1yy", 2, 1, 0)
	write(a, "bad") // fails: the previous value stays, logged once
	check("1yy", 3, 1, 1)
	check("1yy", 3, 1, 1)
	if err := r.Reload(); err == nil { // forced: fails again, not logged again
		t.Error("Reload() of a bad file = nil, want its error")
	}
	check("1yy", 4, 1, 1)
	write(a, "2") // same size and time as "1": only Reload sees it
	check("1yy", 4, 1, 1)
	if err := r.Reload(); err != nil {
		t.Fatalf("Reload() = %v", err)
	}
	check("2yy", 5, 2, 1)
	if rec := logs.Events("tls_reloaded")[0]; rec["listener"] != "grpc" {
		t.Errorf("tls_reloaded = %v, want listener grpc", rec)
	}
}
