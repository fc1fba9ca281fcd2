package telemetry

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

// TestAcquireResult: the one rule of the acquire metric's result label (C4
// #ct4-acquire-result), which both backends use. Before issue 22 etcd
// judged a failure by the caller's context alone and PostgreSQL by the
// error alone: the rows "error after the context ended" and "a context
// error, context live" were labelled differently by the two.
func TestAcquireResult(t *testing.T) {
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	other := errors.New("backend down")
	for _, c := range []struct {
		name string
		ctx  context.Context
		err  error
		want string
	}{
		{"granted", live, nil, AcquireGranted},
		{"granted as the context ended", ended, nil, AcquireGranted},
		{"a failure", live, other, AcquireError},
		{"a deadlock refused", live, fmt.Errorf("acquire: %w", &store.DeadlockError{Keys: []string{"a"}}), AcquireDeadlock},
		{"a failure after the context ended", ended, other, AcquireTimeout},
		{"the context's error", ended, fmt.Errorf("acquire: %w", context.Canceled), AcquireTimeout},
		{"a context error, context live", live, fmt.Errorf("acquire: %w", context.DeadlineExceeded), AcquireTimeout},
	} {
		if got := AcquireResult(c.ctx, c.err); got != c.want {
			t.Errorf("%s: AcquireResult(ctx, %v) = %q; want %q", c.name, c.err, got, c.want)
		}
	}
}
