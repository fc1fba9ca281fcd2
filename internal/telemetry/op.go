package telemetry

import (
	"context"
	"errors"
	"time"

	"lock.dev/lockd/store"
)

// Observe is the prologue of every SPI method of a backend: it starts timing
// op and returns the function that records it. Use it as
//
//	defer s.met.Observe(telemetry.OpInspect)(&err)
//
// with err the method's named error result, so the request's duration and,
// for a backend failure, its error kind (Request) are recorded once, on
// every return path.
func (m *Metrics) Observe(op string) func(err *error) {
	start := time.Now()
	return func(err *error) { m.Request(op, start, *err) }
}

// AcquireResult is the acquire outcome label (C4 #ct4-acquire-result) of
// an Acquire or TryInsert, called with the caller's ctx, that returned err
// and no contended answer: AcquireGranted for no error; for an error,
// AcquireTimeout when ctx had ended by then or err is a context error (an
// error that races the context's end is the context's doing),
// AcquireDeadlock for a wait refused as a deadlock's victim, else
// AcquireError.
func AcquireResult(ctx context.Context, err error) string {
	switch {
	case err == nil:
		return AcquireGranted
	case errors.Is(err, store.ErrDeadlock):
		return AcquireDeadlock
	case ctx.Err() != nil, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return AcquireTimeout
	}
	return AcquireError
}
