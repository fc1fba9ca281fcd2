package telemetry

import (
	"context"
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

// LimitMetrics is the C4 counter lockd_limit_rejections_total{limit}: the
// requests the server refused because one of its bounds (C2 #ct2-limits)
// was reached. A nil *LimitMetrics is valid and records nothing.
type LimitMetrics struct {
	rejections *prometheus.CounterVec
}

// NewLimitMetrics registers lockd_limit_rejections_total on reg; a series
// appears with the first rejection by its limit (C4). When reg already holds
// it (a second server on one registry), the registered counter is shared.
func NewLimitMetrics(reg prometheus.Registerer) (*LimitMetrics, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lockd",
		Name:      "limit_rejections_total",
		Help:      "Requests refused with RESOURCE_EXHAUSTED because a server limit was reached, by limit.",
	}, []string{"limit"})
	if err := reg.Register(c); err != nil {
		are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err)
		if !ok {
			return nil, err
		}
		if c, ok = are.ExistingCollector.(*prometheus.CounterVec); !ok {
			return nil, err
		}
	}
	return &LimitMetrics{rejections: c}, nil
}

// Rejected counts one request refused by the bound limit.
func (m *LimitMetrics) Rejected(limit string) {
	if m == nil {
		return
	}
	m.rejections.WithLabelValues(limit).Inc()
}

// EventPrincipalLimitReached is the C4 event of a call refused for its
// principal's share (C5 #ct5-principal-limits).
const EventPrincipalLimitReached = "principal_limit_reached"

// PrincipalLimitReached logs principal_limit_reached {limit, by, method}.
func PrincipalLimitReached(l *slog.Logger, limit, by, method string) {
	OrDiscard(l).LogAttrs(context.Background(), slog.LevelWarn, EventPrincipalLimitReached,
		slog.String("limit", limit), slog.String("by", by), slog.String("method", method))
}
