package server

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/grpclog"

	"lock.dev/lockd/internal/telemetry"
)

// Every log line lockd writes is JSON (C4 transport events, issue 23 F6):
// net/http's own error log (TLS handshake errors, malformed requests) and
// grpc-go's logger are routed through the server's slog logger, and
// rate-limited together so that a flood of bad connections cannot flood the
// log; dropped lines are counted in lockd_log_lines_dropped_total{source}.

// Rate of the transport lines (C4): 10 per second, bursts of 100.
const (
	transportLogRate  = 10
	transportLogBurst = 100
)

// TransportLog writes net/http's and grpc-go's own log lines as C4 events.
// A nil *TransportLog is not valid; make one with NewTransportLog.
type TransportLog struct {
	log *slog.Logger
	met *telemetry.TransportMetrics
	lim *rate.Limiter
}

// NewTransportLog returns a TransportLog writing to l (nil discards) and
// counting drops on reg.
func NewTransportLog(l *slog.Logger, reg prometheus.Registerer) (*TransportLog, error) {
	met, err := telemetry.NewTransportMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &TransportLog{log: telemetry.OrDiscard(l), met: met, lim: rate.NewLimiter(transportLogRate, transportLogBurst)}, nil
}

// allow takes a line of source from the shared rate, or counts it dropped.
func (t *TransportLog) allow(source string) bool {
	if t.lim.Allow() {
		return true
	}
	t.met.LineDropped(source)
	return false
}

// HTTPErrorLog is the ErrorLog of an http.Server serving listener (the C4
// listener label): each line becomes an http_server_error event.
func (t *TransportLog) HTTPErrorLog(listener string) *log.Logger {
	return log.New(httpLogWriter{t: t, listener: listener}, "", 0)
}

type httpLogWriter struct {
	t        *TransportLog
	listener string
}

func (w httpLogWriter) Write(p []byte) (int, error) {
	if w.t.allow(telemetry.SourceHTTP) {
		telemetry.HTTPServerError(w.t.log, w.listener, strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// grpcSink is where the process's grpc-go logger (GRPCLogger) writes: grpclog
// is process-wide, so its sink is too.
var grpcSink atomic.Pointer[TransportLog]

// ReceiveGRPCLogs makes t the sink of GRPCLogger (the last call wins).
func (t *TransportLog) ReceiveGRPCLogs() { grpcSink.Store(t) }

// GRPCLogger is a grpclog.LoggerV2 that writes grpc-go's warnings and
// errors as grpc_log events to the TransportLog of ReceiveGRPCLogs (none
// yet: dropped) and drops its info lines. Install it once, before anything
// of gRPC runs (grpclog.SetLoggerV2 is not synchronised): cmd/lockd does.
func GRPCLogger() grpclog.LoggerV2 { return grpcLogger{} }

type grpcLogger struct{}

func (grpcLogger) emit(level slog.Level, severity, msg string) {
	t := grpcSink.Load()
	if t == nil || !t.allow(telemetry.SourceGRPC) {
		return
	}
	telemetry.GRPCLog(t.log, level, severity, strings.TrimRight(msg, "\n"))
}

func (grpcLogger) Info(...any)             {}
func (grpcLogger) Infoln(...any)           {}
func (grpcLogger) Infof(string, ...any)    {}
func (grpcLogger) V(int) bool              { return false }
func (g grpcLogger) Warning(args ...any)   { g.emit(slog.LevelWarn, "warning", fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any) { g.emit(slog.LevelWarn, "warning", fmt.Sprintln(args...)) }
func (g grpcLogger) Warningf(format string, args ...any) {
	g.emit(slog.LevelWarn, "warning", fmt.Sprintf(format, args...))
}
func (g grpcLogger) Error(args ...any)   { g.emit(slog.LevelError, "error", fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any) { g.emit(slog.LevelError, "error", fmt.Sprintln(args...)) }
func (g grpcLogger) Errorf(format string, args ...any) {
	g.emit(slog.LevelError, "error", fmt.Sprintf(format, args...))
}

// Fatal logs (unlimited: it is the last line) and exits, as grpclog
// requires.
func (g grpcLogger) Fatal(args ...any)                 { g.fatal(fmt.Sprint(args...)) }
func (g grpcLogger) Fatalln(args ...any)               { g.fatal(fmt.Sprintln(args...)) }
func (g grpcLogger) Fatalf(format string, args ...any) { g.fatal(fmt.Sprintf(format, args...)) }

func (grpcLogger) fatal(msg string) {
	if t := grpcSink.Load(); t != nil {
		t.log.LogAttrs(context.Background(), slog.LevelError, telemetry.EventGRPCLog,
			slog.String("severity", "error"), slog.String("error", strings.TrimRight(msg, "\n")))
	}
	os.Exit(1)
}
