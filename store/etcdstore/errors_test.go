package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/store"
)

func TestClassify(t *testing.T) {
	live := context.Background()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	other := errors.New("something else")
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want error // errors.Is target; nil: returned unchanged
	}{
		{"no leader", live, rpctypes.ErrGRPCNoLeader, store.ErrNotLeader},
		{"not leader", live, rpctypes.ErrGRPCNotLeader, store.ErrNotLeader},
		{"leader changed", live, rpctypes.ErrGRPCLeaderChanged, store.ErrNotLeader},
		{"lease not found", live, rpctypes.ErrGRPCLeaseNotFound, store.ErrSessionDead},
		{"request timed out", live, rpctypes.ErrGRPCTimeout, store.ErrUnavailable},
		{"request timed out (client form)", live, rpctypes.ErrTimeout, store.ErrUnavailable},
		{"too many requests", live, rpctypes.ErrGRPCRequestTooManyRequests, store.ErrContention},
		{"unavailable", live, status.Error(codes.Unavailable, "connection refused"), store.ErrUnavailable},
		{"deadline of our own timeout", live, status.Error(codes.DeadlineExceeded, "x"), store.ErrUnavailable},
		{"context deadline of our own timeout", live, fmt.Errorf("probe: %w", context.DeadlineExceeded), store.ErrUnavailable},
		{"connection canceled", live, status.Error(codes.Canceled, "grpc: the client connection is closing"), store.ErrUnavailable},
		{"eof", live, io.ErrUnexpectedEOF, store.ErrUnavailable},
		{"caller cancelled", cancelled, status.Error(codes.Canceled, "context canceled"), context.Canceled},
		{"caller cancelled during an outage", cancelled, status.Error(codes.Unavailable, "x"), context.Canceled},
		{"unknown", live, other, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := classify(tc.ctx, tc.err)
			if tc.want == nil {
				if got != tc.err {
					t.Fatalf("classify(%v) = %v, want it unchanged", tc.err, got)
				}
				return
			}
			if !errors.Is(got, tc.want) {
				t.Fatalf("classify(%v) = %v, want errors.Is(_, %v)", tc.err, got, tc.want)
			}
			wantRetry := store.IsRetryable(tc.want) // a ctx error or a dead session is not
			if store.IsRetryable(got) != wantRetry {
				t.Fatalf("classify(%v) = %v: IsRetryable %v, want %v", tc.err, got, !wantRetry, wantRetry)
			}
		})
	}
	if classify(live, nil) != nil {
		t.Fatal("classify(nil) != nil")
	}
}
