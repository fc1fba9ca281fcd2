package telemetry

import (
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockd/store"
)

// OpSecretHash is the backend op of reading a session's secret hash
// (lockd_backend_request_seconds.op, C2 #ct2-ownership).
const OpSecretHash = "secret_hash"

// EventAuthDenied is the C4 event of a refused call (#ct4-logs).
const EventAuthDenied = "auth_denied"

// Reasons of a refused call (auth_denied.reason, lockd_auth_denied_total).
const (
	DeniedSecretRequired = "session_secret_required"
	DeniedSecretMismatch = "session_secret_mismatch"
)

// AuthDenied logs auth_denied {backend, method, reason, session}: session is
// the public id the call named, never a secret.
func (g Log) AuthDenied(method, reason string, id store.SessionID) {
	g.warn(EventAuthDenied, slog.String("method", method), slog.String("reason", reason), slog.String("session", string(id)))
}

// AuthMetrics is lockd_auth_denied_total (C4 #ct4-metrics). A nil
// *AuthMetrics records nothing.
type AuthMetrics struct {
	denied *prometheus.CounterVec
}

// NewAuthMetrics creates lockd_auth_denied_total on reg (nil: registered
// nowhere). When reg already holds it (several servers sharing a
// registry), the registered counter is used.
func NewAuthMetrics(reg prometheus.Registerer) (*AuthMetrics, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "lockd", Name: "auth_denied_total",
		Help: "Calls refused for want of authority (a missing or wrong session secret), by RPC and reason."},
		[]string{"method", "reason"})
	if reg != nil {
		if err := reg.Register(c); err != nil {
			are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err)
			if !ok {
				return nil, err
			}
			if c, ok = are.ExistingCollector.(*prometheus.CounterVec); !ok {
				return nil, err
			}
		}
	}
	return &AuthMetrics{denied: c}, nil
}

// Denied counts one refused call of method (an RPC name) for reason.
func (m *AuthMetrics) Denied(method, reason string) {
	if m == nil {
		return
	}
	m.denied.WithLabelValues(method, reason).Inc()
}
