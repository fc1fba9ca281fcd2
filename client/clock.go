package client

import "time"

// Clock is the SDK's source of time. Every deadline, heartbeat and backoff
// of the SDK is measured on it. The real clock uses time.Now, whose readings
// carry Go's monotonic clock, so deadlines are immune to wall-clock steps.
// Tests inject a fake clock (WithClock) to check the deadline arithmetic
// exactly.
type Clock interface {
	// Now returns the current time; only differences between its readings
	// are used.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed on this
	// clock (at once when d <= 0).
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether it
	// did so.
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// RealClock returns the clock the SDK uses by default.
func RealClock() Clock { return realClock{} }
