package lockdtest

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Record is one captured log record.
type Record struct {
	Time    time.Time // when it was logged (local monotonic clock)
	Level   slog.Level
	Message string
	Attrs   map[string]string
}

// Logs captures log records for assertions. Use Logger as the server's or
// store's logger. It is safe for concurrent use.
type Logs struct {
	mu      sync.Mutex
	records []Record
}

// Logger returns a logger that records into l.
func (l *Logs) Logger() *slog.Logger { return slog.New(&logHandler{logs: l}) }

// Find returns the records with message msg whose attributes include every
// key/value pair of match.
func (l *Logs) Find(msg string, match map[string]string) []Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Record
next:
	for _, r := range l.records {
		if r.Message != msg {
			continue
		}
		for k, v := range match {
			if r.Attrs[k] != v {
				continue next
			}
		}
		out = append(out, r)
	}
	return out
}

// All returns every record.
func (l *Logs) All() []Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Record(nil), l.records...)
}

type logHandler struct {
	logs  *Logs
	attrs []slog.Attr
}

func (h *logHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *logHandler) Handle(_ context.Context, r slog.Record) error {
	rec := Record{Time: time.Now(), Level: r.Level, Message: r.Message, Attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.Attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.String()
		return true
	})
	h.logs.mu.Lock()
	h.logs.records = append(h.logs.records, rec)
	h.logs.mu.Unlock()
	return nil
}

func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logHandler{logs: h.logs, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h *logHandler) WithGroup(string) slog.Handler { return h }
