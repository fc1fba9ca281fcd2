package telemetry

import (
	"context"
	"log/slog"
	"time"

	"lock.dev/lockd/store"
)

// Log event names (C4 #ct4-logs). The slog message is the event name.
const (
	EventSessionOpened = "session_opened"
	EventSessionLost   = "session_lost"
	EventSessionClosed = "session_closed"
	EventLeaseExpired  = "lease_expired"
	EventLockAcquired  = "lock_acquired"
	EventLockReleased  = "lock_released"
	EventLockRevoked   = "lock_revoked"

	// Operational events (C4 #ct4-logs).
	EventEmbeddedDataDir         = "embedded_etcd_data_dir"
	EventTracingError            = "tracing_error"
	EventRPCFailed               = "rpc_failed"
	EventHeartbeatFailed         = "heartbeat_failed"
	EventSilenceCloseFailed      = "silence_close_failed"
	EventNoticesDropped          = "notices_dropped"
	EventLockLossWatchFailed     = "lock_loss_watch_failed"
	EventLockLossWatchBroke      = "lock_loss_watch_broke"
	EventLockLossReconcileFailed = "lock_loss_reconcile_failed"
	EventGrantValueNotStored     = "grant_value_not_stored"
	EventLeaveQueueFailed        = "leave_queue_failed"
	EventMaxHoldRevokeFailed     = "max_hold_revoke_failed"
)

// Reasons a session is lost (session_lost.reason, lockd_sessions_lost_total).
const (
	LostLeaseExpired    = "lease_expired"
	LostKeepaliveFailed = "keepalive_failed"
	LostClientSilent    = "client_silent"
	LostRevoked         = "revoked"
	LostBackendError    = "backend_error"
)

// Reasons a lock is released (lock_released.reason, lockd_lock_release_total).
const (
	ReleaseRelease       = "release"
	ReleaseSessionClosed = "session_closed"
	ReleaseSessionLost   = "session_lost"
	ReleaseRevoked       = "revoked"
	ReleaseMaxHold       = "max_hold" // C2 #ct2-delay
)

// Discard is a logger that drops everything: the default of every library
// package.
var Discard = slog.New(slog.DiscardHandler)

// OrDiscard returns l, or Discard when l is nil.
func OrDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return Discard
	}
	return l
}

// Log emits the C4 events with exactly their required fields.
type Log struct {
	L       *slog.Logger
	Backend string
}

func (g Log) info(msg string, attrs ...slog.Attr) {
	l := OrDiscard(g.L)
	if !l.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	l.LogAttrs(context.Background(), slog.LevelInfo, msg, append([]slog.Attr{slog.String("backend", g.Backend)}, attrs...)...)
}

func (g Log) warn(msg string, attrs ...slog.Attr) {
	l := OrDiscard(g.L)
	if !l.Enabled(context.Background(), slog.LevelWarn) {
		return
	}
	l.LogAttrs(context.Background(), slog.LevelWarn, msg, append([]slog.Attr{slog.String("backend", g.Backend)}, attrs...)...)
}

// SessionOpened logs session_opened {backend, session, ttl_ms}.
func (g Log) SessionOpened(id store.SessionID, ttl time.Duration) {
	g.info(EventSessionOpened, slog.String("session", string(id)), slog.Int64("ttl_ms", ttl.Milliseconds()))
}

// SessionLost logs session_lost {backend, session, reason}.
func (g Log) SessionLost(id store.SessionID, reason string) {
	g.warn(EventSessionLost, slog.String("session", string(id)), slog.String("reason", reason))
}

// SessionClosed logs session_closed {backend, session, released, by, rule};
// by and rule say who closed it (C4 #ct4-audit), from ctx (WithCaller),
// omitted when ctx carries none.
func (g Log) SessionClosed(ctx context.Context, id store.SessionID, released int) {
	attrs := []slog.Attr{slog.String("session", string(id)), slog.Int("released", released)}
	if by, rule, ok := CallerOf(ctx); ok {
		attrs = append(attrs, slog.String("by", by), slog.String("rule", rule))
	}
	g.info(EventSessionClosed, attrs...)
}

// LeaseExpired logs lease_expired {backend, session}.
func (g Log) LeaseExpired(id store.SessionID) {
	g.warn(EventLeaseExpired, slog.String("session", string(id)))
}

// LockAcquired logs lock_acquired {backend, session, key, token, waited_ms}.
func (g Log) LockAcquired(gr store.Grant, waited time.Duration) {
	g.info(EventLockAcquired, slog.String("session", string(gr.Session)), slog.String("key", gr.Key),
		slog.Uint64("token", gr.Token), slog.Int64("waited_ms", waited.Milliseconds()))
}

// LockReleased logs lock_released {backend, session, key, token, reason}.
func (g Log) LockReleased(gr store.Grant, reason string) {
	g.info(EventLockReleased, slog.String("session", string(gr.Session)), slog.String("key", gr.Key),
		slog.Uint64("token", gr.Token), slog.String("reason", reason))
}

// LockRevoked logs lock_revoked {backend, key, token, by, rule}; by and rule
// are the caller's principal and the access rule that allowed the revoke,
// from ctx (WithCaller), omitted when ctx carries none.
func (g Log) LockRevoked(ctx context.Context, key string, token uint64) {
	attrs := []slog.Attr{slog.String("key", key), slog.Uint64("token", token)}
	if by, rule, ok := CallerOf(ctx); ok {
		attrs = append(attrs, slog.String("by", by), slog.String("rule", rule))
	}
	g.warn(EventLockRevoked, attrs...)
}

// MaxHoldRevokeFailed logs max_hold_revoke_failed {backend, session, key,
// token, error}: a revoke of a grant held past its maximum hold failed and
// will be tried again (C2 #ct2-delay).
func (g Log) MaxHoldRevokeFailed(id store.SessionID, key string, token uint64, err error) {
	g.warn(EventMaxHoldRevokeFailed, slog.String("session", string(id)), slog.String("key", key),
		slog.Uint64("token", token), slog.String("error", err.Error()))
}
