package telemetry

import (
	"context"
	"errors"
	"time"
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

// ObserveAcquire is Observe for an Acquire: besides the request it counts
// the attempt's outcome (AcquireGranted with the time waited,
// AcquireTimeout when the caller's context ended it, AcquireError
// otherwise).
func (m *Metrics) ObserveAcquire() func(err *error) {
	start := time.Now()
	return func(err *error) {
		m.Request(OpAcquire, start, *err)
		m.Acquire(AcquireResult(*err), time.Since(start))
	}
}

// AcquireResult is the acquire outcome label for an Acquire that returned
// err.
func AcquireResult(err error) string {
	switch {
	case err == nil:
		return AcquireGranted
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return AcquireTimeout
	}
	return AcquireError
}
