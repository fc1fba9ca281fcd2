package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/store"
)

// errClosed is returned by every method of a closed Store.
var errClosed = fmt.Errorf("%w: etcdstore: store closed", store.ErrUnavailable)

// errMalformed reports a key this package did not write the way it reads
// it: someone else writes under the prefix.
var errMalformed = errors.New("etcdstore: malformed data under the prefix")

// errWatchEnded: a watch ended without the caller's ctx ending; the caller
// reads the state again.
var errWatchEnded = errors.New("etcdstore: watch ended")

func deadErr(ss *session) error {
	return fmt.Errorf("%w: session %s ended while waiting", store.ErrSessionDead, ss.id)
}

// classify maps an error from clientv3/gRPC into the store sentinels. It is
// the one place that knows etcd's errors. When the caller's ctx is done the
// result matches ctx.Err() and is not retryable. Errors it does not know are
// returned unchanged.
func classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		if errors.Is(err, ctx.Err()) {
			return err
		}
		return fmt.Errorf("%w: %w", ctx.Err(), err)
	}
	if errors.Is(err, store.ErrContention) || errors.Is(err, store.ErrNotLeader) ||
		errors.Is(err, store.ErrSessionDead) {
		return err // already classified
	}
	ee := rpctypes.Error(err)
	switch {
	case errors.Is(ee, rpctypes.ErrLeaseNotFound):
		return fmt.Errorf("%w: %w", store.ErrSessionDead, err)
	case errors.Is(ee, rpctypes.ErrNoLeader), errors.Is(ee, rpctypes.ErrNotLeader),
		errors.Is(ee, rpctypes.ErrLeaderChanged):
		return fmt.Errorf("%w: %w", store.ErrNotLeader, err)
	case errors.Is(ee, rpctypes.ErrNoSpace):
		// The NOSPACE alarm: etcd refuses every write until it is
		// compacted, defragmented and the alarm disarmed (the embedded
		// server does that itself; C5 #ct5-storage).
		return fmt.Errorf("%w: %w (etcd's NOSPACE alarm is raised: writes fail until the database is compacted, defragmented and the alarm disarmed)", store.ErrUnavailable, ee)
	case errors.Is(ee, rpctypes.ErrTooManyRequests), errors.Is(ee, rpctypes.ErrCompacted):
		return fmt.Errorf("%w: %w", store.ErrContention, err)
	}
	// etcd's own timeouts ("request timed out", "timed out waiting for read
	// index") arrive as rpctypes.EtcdError, not as a gRPC status.
	var etcdErr rpctypes.EtcdError
	if errors.As(ee, &etcdErr) {
		switch etcdErr.Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
		}
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			// Canceled while the caller's ctx is alive: the connection or
			// one of our own internal timeouts went away.
			return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
		case codes.Aborted, codes.ResourceExhausted:
			return fmt.Errorf("%w: %w", store.ErrContention, err)
		}
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, clientv3.ErrNoAvailableEndpoints),
		errors.As(err, &ne):
		return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return err
}
