package telemetry

import (
	"context"
	"log/slog"
)

// Transport security events (C4 #ct4-logs, issue #12 §1). They carry no
// backend field and never a secret (password, DSN, private key).
const (
	EventTLSReloaded      = "tls_reloaded"
	EventTLSReloadFailed  = "tls_reload_failed"
	EventInsecureListener = "insecure_listener"
	EventPGTLSWeak        = "pg_tls_weak"
	ListenerGRPC          = "grpc"    // listener label: lock.server.listen
	ListenerMetrics       = "metrics" // listener label: lock.server.metrics-listen
	ListenerHTTP          = "http"    // listener label: lock.server.http.listen (C5 #ct5-http)
	ListenerEtcd          = "etcd"    // not a listener: the etcd client's lock.etcd.tls.* files (C5 #ct5-tls)
	// Reasons of insecure_listener (C5 #ct5-tls, #ct5-unsafe).
	InsecurePlaintext      = "plaintext"
	InsecureAnonymousAdmin = "anonymous_admin"
	PGTLSOptional          = "optional"
	PGTLSUnverified        = "unverified"
)

// TLSReloaded logs tls_reloaded {listener}: new certificate or CA files are
// in force for new connections.
func TLSReloaded(l *slog.Logger, listener string) {
	OrDiscard(l).LogAttrs(context.Background(), slog.LevelInfo, EventTLSReloaded, slog.String("listener", listener))
}

// TLSReloadFailed logs tls_reload_failed {listener, error}: the files
// changed but could not be loaded; the previous ones stay in force.
func TLSReloadFailed(l *slog.Logger, listener string, err error) {
	OrDiscard(l).LogAttrs(context.Background(), slog.LevelWarn, EventTLSReloadFailed,
		slog.String("listener", listener), slog.String("error", err.Error()))
}

// InsecureListener logs insecure_listener {listener, address, reason}: a
// listener on a non-loopback address serves plaintext (InsecurePlaintext),
// or makes every caller an anonymous admin (InsecureAnonymousAdmin),
// because lock.server.insecure-allow-remote is set.
func InsecureListener(l *slog.Logger, listener, address, reason string) {
	OrDiscard(l).LogAttrs(context.Background(), slog.LevelWarn, EventInsecureListener,
		slog.String("listener", listener), slog.String("address", address), slog.String("reason", reason))
}

// PGTLSWeak logs pg_tls_weak {host, tls}: a non-local PostgreSQL host is
// reached with an sslmode weaker than verify-full (tls is PGTLSOptional or
// PGTLSUnverified).
func PGTLSWeak(l *slog.Logger, host, tls string) {
	OrDiscard(l).LogAttrs(context.Background(), slog.LevelWarn, EventPGTLSWeak,
		slog.String("host", host), slog.String("tls", tls))
}
