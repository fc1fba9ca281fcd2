package telemetry

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockd/store"
)

// Acquire results (lockd_lock_acquire_total.result).
const (
	AcquireGranted   = "granted"
	AcquireContended = "contended"
	AcquireTimeout   = "timeout"
	AcquireError     = "error"
	// AcquireDeadlock: the wait was refused as a deadlock's victim (C2
	// #ct2-deadlock).
	AcquireDeadlock = "deadlock"
)

// Backend error kinds (lockd_backend_errors_total.kind).
const (
	KindContention  = "contention"
	KindNotLeader   = "not_leader"
	KindUnavailable = "unavailable"
	KindOther       = "other"
)

// Backend operations (lockd_backend_request_seconds.op,
// lockd_backend_errors_total.op): a fixed set.
const (
	OpOpenSession  = "open_session"
	OpHeartbeat    = "heartbeat"
	OpKeepAlive    = "keepalive"
	OpCloseSession = "close_session"
	OpLocksOf      = "locks_of"
	OpTryInsert    = "try_insert"
	OpGrantFree    = "grant_free"
	OpAcquire      = "acquire"
	OpLeaveQueue   = "leave_queue"
	OpRelease      = "release"
	OpRevoke       = "revoke"
	OpInspect      = "inspect"
	OpList         = "list"
	// OpListSessions is ListSessions (C2 #ct2-list-sessions).
	OpListSessions = "list_sessions"
	OpWatch        = "watch"
	OpReap         = "reap"
	OpMigrate      = "migrate"
)

// Kinds of group-commit batch (lockd_backend_batch_size.batch).
const (
	// BatchLocks: grants and releases sharing one backend commit.
	BatchLocks = "locks"
	// BatchHeartbeats: session renewals sharing one statement.
	BatchHeartbeats = "heartbeats"
)

// Metrics are the C4 metrics (#ct4-metrics) for one backend label. A nil
// *Metrics is valid and records nothing.
type Metrics struct {
	backend        string
	sessionsActive *prometheus.GaugeVec
	sessionsOpened *prometheus.CounterVec
	sessionsLost   *prometheus.CounterVec
	leasesExpired  *prometheus.CounterVec
	locksHeld      *prometheus.GaugeVec
	acquireTotal   *prometheus.CounterVec
	acquireSeconds *prometheus.HistogramVec
	releaseTotal   *prometheus.CounterVec
	backendSeconds *prometheus.HistogramVec
	backendErrors  *prometheus.CounterVec
	batchSize      *prometheus.HistogramVec
	authDenied     *prometheus.CounterVec
}

// NewMetrics creates the C4 metrics labelled backend=backend and registers
// them on reg (nil: not registered anywhere). It fails if reg already holds
// them.
func NewMetrics(reg prometheus.Registerer, backend string) (*Metrics, error) {
	m := &Metrics{
		backend: backend,
		sessionsActive: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "lockd", Name: "sessions_active",
			Help: "Sessions currently live on this lockd."}, []string{"backend"}),
		sessionsOpened: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "lockd", Name: "sessions_opened_total",
			Help: "Sessions opened."}, []string{"backend"}),
		sessionsLost: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "lockd", Name: "sessions_lost_total",
			Help: "Sessions that ended other than by an explicit close, by reason."}, []string{"backend", "reason"}),
		leasesExpired: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "lockd", Name: "leases_expired_total",
			Help: "Sessions freed by the backend's own expiry (etcd lease, PostgreSQL reaper)."}, []string{"backend"}),
		locksHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "lockd", Name: "locks_held",
			Help: "Locks held by sessions of this lockd."}, []string{"backend"}),
		acquireTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "lockd", Name: "lock_acquire_total",
			Help: "Acquire attempts by result."}, []string{"backend", "result"}),
		acquireSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "lockd", Name: "lock_acquire_seconds",
			Help:    "Time to acquire a lock, including waiting.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, []string{"backend"}),
		releaseTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "lockd", Name: "lock_release_total",
			Help: "Locks released, by reason."}, []string{"backend", "reason"}),
		backendSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "lockd", Name: "backend_request_seconds",
			Help:    "Latency of backend requests, by operation.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10)}, []string{"backend", "op"}),
		backendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "lockd", Name: "backend_errors_total",
			Help: "Backend request errors, by operation and kind."}, []string{"backend", "op", "kind"}),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "lockd", Name: "backend_batch_size",
			Help:    "Requests that shared one backend commit (group commit), by kind of batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9)}, []string{"backend", "batch"}),
		authDenied: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "lockd", Name: "auth_denied_total",
			Help: "Calls refused by access control, by RPC and reason."}, []string{"method", "reason"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.sessionsActive, m.sessionsOpened, m.sessionsLost, m.leasesExpired,
			m.locksHeld, m.acquireTotal, m.acquireSeconds, m.releaseTotal, m.backendSeconds, m.backendErrors, m.batchSize, m.authDenied} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	// Touch the label-less series so they exist from the start.
	m.sessionsActive.WithLabelValues(backend)
	m.sessionsOpened.WithLabelValues(backend)
	m.leasesExpired.WithLabelValues(backend)
	m.locksHeld.WithLabelValues(backend)
	return m, nil
}

// Backend is the backend label.
func (m *Metrics) Backend() string {
	if m == nil {
		return ""
	}
	return m.backend
}

// SessionOpened counts an opened session and adds it to the active gauge.
func (m *Metrics) SessionOpened() {
	if m == nil {
		return
	}
	m.sessionsOpened.WithLabelValues(m.backend).Inc()
	m.sessionsActive.WithLabelValues(m.backend).Inc()
}

// SessionEnded removes a session from the active gauge; a non-empty reason
// also counts it as lost (close passes "").
func (m *Metrics) SessionEnded(lostReason string) {
	if m == nil {
		return
	}
	m.sessionsActive.WithLabelValues(m.backend).Dec()
	if lostReason != "" {
		m.sessionsLost.WithLabelValues(m.backend, lostReason).Inc()
	}
}

// SessionLost counts a session lost for reason without touching the active
// gauge: the server uses it for client_silent, where the store that closed
// the session already removed it from the gauge (SessionEnded("")).
func (m *Metrics) SessionLost(reason string) {
	if m == nil {
		return
	}
	m.sessionsLost.WithLabelValues(m.backend, reason).Inc()
}

// LeaseExpired counts a session freed by backend expiry.
func (m *Metrics) LeaseExpired() {
	if m == nil {
		return
	}
	m.leasesExpired.WithLabelValues(m.backend).Inc()
}

// LocksHeld adds delta to the held-locks gauge.
func (m *Metrics) LocksHeld(delta int) {
	if m == nil {
		return
	}
	m.locksHeld.WithLabelValues(m.backend).Add(float64(delta))
}

// Acquire counts an acquire attempt; took is observed for granted ones.
func (m *Metrics) Acquire(result string, took time.Duration) {
	if m == nil {
		return
	}
	m.acquireTotal.WithLabelValues(m.backend, result).Inc()
	if result == AcquireGranted {
		m.acquireSeconds.WithLabelValues(m.backend).Observe(took.Seconds())
	}
}

// Released counts released locks by reason.
func (m *Metrics) Released(reason string, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.releaseTotal.WithLabelValues(m.backend, reason).Add(float64(n))
	m.locksHeld.WithLabelValues(m.backend).Sub(float64(n))
}

// ReleasedElsewhere counts released locks by reason that this instance's
// held gauge does not include: grants made through another replica, ended
// with a session this instance ended (C4 #ct4-replica-count).
func (m *Metrics) ReleasedElsewhere(reason string, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.releaseTotal.WithLabelValues(m.backend, reason).Add(float64(n))
}

// Request observes one backend request and, when err is a backend failure,
// counts it by kind. Context cancellation and the SPI's non-failure errors
// (invalid argument, dead session, not owner) are not backend errors.
func (m *Metrics) Request(op string, start time.Time, err error) {
	if m == nil {
		return
	}
	m.backendSeconds.WithLabelValues(m.backend, op).Observe(time.Since(start).Seconds())
	if kind := ErrorKind(err); kind != "" {
		m.backendErrors.WithLabelValues(m.backend, op, kind).Inc()
	}
}

// Batch observes one group commit of n requests of the given kind
// (BatchLocks, BatchHeartbeats).
func (m *Metrics) Batch(kind string, n int) {
	if m == nil {
		return
	}
	m.batchSize.WithLabelValues(m.backend, kind).Observe(float64(n))
}

// AuthDenied counts a refused call: method is the RPC name, reason
// DeniedAccess or DeniedUnauthenticated.
func (m *Metrics) AuthDenied(method, reason string) {
	if m == nil {
		return
	}
	m.authDenied.WithLabelValues(method, reason).Inc()
}

// ErrorKind maps an already classified store error to a C4 error kind, or ""
// when err is not a backend failure.
func ErrorKind(err error) string {
	switch {
	case err == nil,
		errors.Is(err, store.ErrInvalidArgument), errors.Is(err, store.ErrSessionDead), errors.Is(err, store.ErrNotOwner),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ""
	case errors.Is(err, store.ErrNotLeader):
		return KindNotLeader
	case errors.Is(err, store.ErrUnavailable):
		return KindUnavailable
	case errors.Is(err, store.ErrContention):
		return KindContention
	}
	return KindOther
}
