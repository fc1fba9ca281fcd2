package telemetry

import (
	"context"
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

// Transport events and metrics (C4 #ct4-logs, #ct4-metrics; issue 23): the
// connections the server closes for want of an authorised call (C5
// #ct5-idle), and the lines of net/http's and grpc-go's own loggers, routed
// through slog and rate-limited.
const (
	EventHTTPServerError = "http_server_error"
	EventGRPCLog         = "grpc_log"
	// ClosedUnauthorised is the reason of lockd_connections_closed_total: no
	// authorised call within lock.server.conn-auth-timeout.
	ClosedUnauthorised = "unauthorised"
	// Sources of lockd_log_lines_dropped_total.
	SourceHTTP = "http"
	SourceGRPC = "grpc"
)

// TransportMetrics are the C4 counters lockd_connections_closed_total
// {listener, reason} and lockd_log_lines_dropped_total{source}. A nil
// *TransportMetrics is valid and records nothing.
type TransportMetrics struct {
	closed  *prometheus.CounterVec
	dropped *prometheus.CounterVec
}

// NewTransportMetrics registers both counters on reg (sharing them when reg
// already holds them: a second server on one registry).
func NewTransportMetrics(reg prometheus.Registerer) (*TransportMetrics, error) {
	closed, err := registerCounterVec(reg, prometheus.CounterOpts{
		Namespace: "lockd",
		Name:      "connections_closed_total",
		Help:      "Client connections the server closed, by listener and reason (unauthorised: no authorised call within lock.server.conn-auth-timeout).",
	}, "listener", "reason")
	if err != nil {
		return nil, err
	}
	dropped, err := registerCounterVec(reg, prometheus.CounterOpts{
		Namespace: "lockd",
		Name:      "log_lines_dropped_total",
		Help:      "Lines of net/http's and grpc-go's own loggers dropped over the rate limit, by source.",
	}, "source")
	if err != nil {
		return nil, err
	}
	return &TransportMetrics{closed: closed, dropped: dropped}, nil
}

func registerCounterVec(reg prometheus.Registerer, opts prometheus.CounterOpts, labels ...string) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(opts, labels)
	if err := reg.Register(c); err != nil {
		are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err)
		if !ok {
			return nil, err
		}
		if c, ok = are.ExistingCollector.(*prometheus.CounterVec); !ok {
			return nil, err
		}
	}
	return c, nil
}

// ConnClosed counts a connection of listener closed for reason.
func (m *TransportMetrics) ConnClosed(listener, reason string) {
	if m != nil {
		m.closed.WithLabelValues(listener, reason).Inc()
	}
}

// LineDropped counts a log line of source dropped over the rate.
func (m *TransportMetrics) LineDropped(source string) {
	if m != nil {
		m.dropped.WithLabelValues(source).Inc()
	}
}

// HTTPServerError logs http_server_error {listener, error}: a line of
// net/http's own error log (a TLS handshake error, a malformed request).
func HTTPServerError(l *slog.Logger, listener, msg string) {
	OrDiscard(l).LogAttrs(context.Background(), slog.LevelWarn, EventHTTPServerError,
		slog.String("listener", listener), slog.String("error", msg))
}

// GRPCLog logs grpc_log {severity, error}: a warning or error of grpc-go's
// own logger.
func GRPCLog(l *slog.Logger, level slog.Level, severity, msg string) {
	OrDiscard(l).LogAttrs(context.Background(), level, EventGRPCLog,
		slog.String("severity", severity), slog.String("error", msg))
}
