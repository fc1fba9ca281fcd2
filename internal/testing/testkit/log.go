package testkit

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// LogBuffer is a bytes.Buffer that is safe for a writer (a logger, a
// command's stdout) running while the test reads it.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Records decodes the JSON lines written so far (as written by the logger
// of NewLogger); lines that are not JSON objects are skipped.
func (l *LogBuffer) Records() []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(l.String(), "\n") {
		var rec map[string]any
		if line == "" || json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		out = append(out, rec)
	}
	return out
}

// Events returns the records whose message is event (C4: the message is the
// event name).
func (l *LogBuffer) Events(event string) []map[string]any {
	var out []map[string]any
	for _, rec := range l.Records() {
		if rec["msg"] == event {
			out = append(out, rec)
		}
	}
	return out
}

// NewLogger returns a debug-level JSON logger writing to a new LogBuffer.
func NewLogger() (*slog.Logger, *LogBuffer) {
	buf := &LogBuffer{}
	return slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// FailureLogger returns a debug-level logger whose records are written to
// t's log when t has failed by the end of the test, and dropped otherwise: a
// timing failure seen once in a CI run then carries the server's own account
// of it.
func FailureLogger(t testing.TB) *slog.Logger {
	lg, buf := NewLogger()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the server's log:\n%s", buf.String())
		}
	})
	return lg
}
