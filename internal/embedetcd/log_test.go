package embedetcd_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"

	"lock.dev/lockd/internal/embedetcd"
)

func TestZapLoggerRoutesWarnToSlog(t *testing.T) {
	var buf bytes.Buffer
	lg := embedetcd.ZapLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	lg.Info("chatty", zap.String("a", "b"))
	lg.With(zap.Int("member", 1)).Warn("slow fdatasync", zap.Duration("took", 0))
	lg.Error("failed", zap.Error(bytes.ErrTooLarge))
	out := buf.String()
	if strings.Contains(out, "chatty") {
		t.Errorf("info entry was forwarded:\n%s", out)
	}
	for _, want := range []string{`level=WARN msg="slow fdatasync" component=etcd member=1 took=0s`, `level=ERROR msg=failed component=etcd error=`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if embedetcd.ZapLogger(nil) == nil {
		t.Error("ZapLogger(nil) = nil, want a no-op logger")
	}
}
