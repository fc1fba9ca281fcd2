package telemetry

import (
	"context"
	"log/slog"
)

// Storage upkeep events of the embedded etcd (C4 #ct4-logs, C5
// #ct5-storage).
const (
	EventBackendCompacted      = "backend_compacted"
	EventBackendSpaceExhausted = "backend_space_exhausted"
	EventBackendSpaceRecovered = "backend_space_recovered"
)

// BackendCompacted logs backend_compacted {backend, revision} at debug.
func (g Log) BackendCompacted(rev int64) {
	l := OrDiscard(g.L)
	if !l.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	l.LogAttrs(context.Background(), slog.LevelDebug, EventBackendCompacted,
		slog.String("backend", g.Backend), slog.Int64("revision", rev))
}

// BackendSpaceExhausted logs backend_space_exhausted {backend,
// db_size_bytes, quota_bytes}.
func (g Log) BackendSpaceExhausted(dbSize, quota int64) {
	g.warn(EventBackendSpaceExhausted, slog.Int64("db_size_bytes", dbSize), slog.Int64("quota_bytes", quota))
}

// BackendSpaceRecovered logs backend_space_recovered {backend,
// db_size_bytes, revision}.
func (g Log) BackendSpaceRecovered(dbSize, rev int64) {
	g.info(EventBackendSpaceRecovered, slog.Int64("db_size_bytes", dbSize), slog.Int64("revision", rev))
}
