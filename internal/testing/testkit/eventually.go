package testkit

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Condition is what Eventually polls: a func() bool that reports whether
// the condition holds, or a func() error that returns nil once it does (its
// last error is shown when the deadline passes).
type Condition interface {
	func() bool | func() error
}

// PollInterval is how often Eventually re-checks its condition.
const PollInterval = 10 * time.Millisecond

var errFalse = errors.New("condition is false")

// Eventually polls cond every PollInterval until it holds, failing the test
// (t.Fatalf, naming what and, for a func() error, the last error) if it
// still does not hold after within. It is the one way tests wait for
// something time-based; a sleep followed by an assertion is not.
func Eventually[C Condition](t testing.TB, within time.Duration, what string, cond C) {
	t.Helper()
	if err := Poll(within, cond); err != nil {
		t.Fatalf("%s: not true after %v: %v", what, within, err)
	}
}

// Poll is Eventually without a test: it returns nil as soon as cond holds,
// or the last reason it did not once within has passed. For helpers that
// run outside a test goroutine and report the failure themselves.
func Poll[C Condition](within time.Duration, cond C) error {
	check := func() error {
		switch c := any(cond).(type) {
		case func() bool:
			if c() {
				return nil
			}
			return errFalse
		case func() error:
			return c()
		}
		panic("unreachable: Condition has two types")
	}
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(PollInterval)
	}
}

// Context returns a context that is cancelled after d or when the test
// ends, whichever comes first.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
