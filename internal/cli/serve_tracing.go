package cli

import (
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"

	"lock.dev/lockd/internal/telemetry"
)

// routeTracingErrors sends OpenTelemetry's own errors (an export failure
// among them) to the operational log as tracing_error, at most one line a
// second (C5 #ct5-tracing). OpenTelemetry's error handler is process-wide:
// only lockd serve, with tracing on, sets it.
func routeTracingErrors(l *slog.Logger) {
	var last atomic.Int64 // unix nanoseconds of the last line
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		now, prev := time.Now().UnixNano(), last.Load()
		if now-prev < int64(time.Second) || !last.CompareAndSwap(prev, now) {
			return
		}
		l.Warn(telemetry.EventTracingError, slog.String("error", err.Error()))
	}))
}
