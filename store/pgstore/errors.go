package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"lock.dev/lockd/store"
)

// errClosed is what every method returns after Close. The store is gone
// from the caller's point of view as if the backend were unreachable.
var errClosed = fmt.Errorf("pgstore: store closed: %w", store.ErrUnavailable)

// errSlowConsumer ends a watch whose consumer fell watchBuffer events
// behind.
var errSlowConsumer = fmt.Errorf("pgstore: watch consumer fell %d events behind: %w", watchBuffer, store.ErrContention)

// classify turns an error from pgx (or the server) into a store error. It is
// the only place in the package that inspects driver errors:
//
//   - the caller's context is done: an error matching ctx.Err(), never a
//     retryable sentinel, whatever the driver reported;
//   - serialization failure (40001), deadlock (40P01), lock not available
//     (55P03): ErrContention;
//   - read-only transaction (25006, a standby): ErrNotLeader;
//   - foreign key violation (23503): ErrSessionDead (every foreign key in
//     the schema references sessions, so a violation means the session
//     row is gone);
//   - connection refused, lost or timed out, server shutting down or
//     refusing connections (08*, 57P01-57P03, 53300), statement cancelled
//     by a timeout (57014): ErrUnavailable;
//   - anything else: wrapped as is (not retryable).
//
// A classified error keeps the driver's text but not its chain, so that a
// driver timeout (which wraps context.DeadlineExceeded) cannot be mistaken
// for the caller's own deadline.
func classify(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := callerDone(ctx, op, err); cerr != nil {
		return cerr
	}
	var sentinel error
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		switch code := pgErr.Code; {
		case code == "40001", code == "40P01", code == "55P03":
			sentinel = store.ErrContention
		case code == "25006":
			sentinel = store.ErrNotLeader
		case code == "23503":
			sentinel = store.ErrSessionDead
		case strings.HasPrefix(code, "08"), code == "57P01", code == "57P02", code == "57P03",
			code == "53300", code == "57014":
			sentinel = store.ErrUnavailable
		}
	case connectionProblem(err):
		sentinel = store.ErrUnavailable
	}
	if sentinel == nil {
		return fmt.Errorf("pgstore: %s: %w", op, err)
	}
	return fmt.Errorf("pgstore: %s: %w (%v)", op, sentinel, err)
}

// connectionProblem reports whether err says the server could not be
// reached or the connection broke.
func connectionProblem(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return pgconn.Timeout(err) || errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, puddle.ErrClosedPool) || errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err)
}

// callerDone returns, when the caller's ctx has ended, err as an error
// matching ctx.Err() (never a retryable sentinel); nil otherwise.
func callerDone(ctx context.Context, op string, err error) error {
	ctxErr := ctx.Err()
	switch {
	case ctxErr == nil:
		return nil
	case errors.Is(err, ctxErr):
		return fmt.Errorf("pgstore: %s: %w", op, ctxErr)
	}
	return fmt.Errorf("pgstore: %s: %w (%v)", op, ctxErr, err)
}

// result turns what wait returned into the error a Store method returns:
// when the caller's ctx has ended, an error matching ctx.Err(), never a
// retryable sentinel.
func result(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := callerDone(ctx, op, err); cerr != nil {
		return cerr
	}
	return err
}
