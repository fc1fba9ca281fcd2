package store

import (
	"context"
	"errors"
	"strings"
)

// ErrDeadlock: an Acquire's wait was refused because it closed a cycle of
// waiting sessions (C2 #ct2-deadlock). The place in the queue was left;
// nothing else changed. Not retryable. The error is a *DeadlockError,
// which names the cycle's keys.
var ErrDeadlock = errors.New("store: deadlock")

// DeadlockError is the ErrDeadlock of one refused wait: Keys are the keys
// of the waits inside the cycle (sorted), the refused one among them.
type DeadlockError struct {
	Keys []string
}

func (e *DeadlockError) Error() string {
	return "store: deadlock: the wait closes a cycle of waiting sessions over keys " + strings.Join(e.Keys, ", ")
}

// Is makes errors.Is(err, ErrDeadlock) hold.
func (e *DeadlockError) Is(target error) bool { return target == ErrDeadlock }

// NoDeadlockCheck opts an Acquire out of deadlock refusal (C2
// #ct2-deadlock): its wait still counts in the wait-for graph, but it is
// never the one refused.
func NoDeadlockCheck() AcquireOption { return func(o *AcquireOptions) { o.NoDeadlockCheck = true } }

// DeadlockScanGater is implemented by a backend whose deadlock detector a
// test can drive scan by scan (C2 #ct2-deadlock, "Test hook"; storetest's
// DeadlockDissolved). SetDeadlockScanGate makes every scan that reads the
// wait-for graph call gate first and read only when it returns; nil
// removes it. gate must return when its context ends. Tests only: a gate
// that blocks stops detection.
type DeadlockScanGater interface {
	SetDeadlockScanGate(gate func(ctx context.Context))
}

// Wait is a session's place in a key's queue, as a backend read it for the
// wait-for graph (C2 #ct2-deadlock): a plain key's, or a semaphore's or
// read/write lock's (C2 #ct2-multi).
type Wait struct {
	Session SessionID
	Key     string
	// Seq orders the waits by age, over every key and kind: a place queued
	// later has a larger Seq (etcd: the waiter key's create revision;
	// PostgreSQL: the row id, waiters and slot_waiters drawing from one
	// sequence).
	Seq int64
	// NoCheck: the place was queued with NoDeadlockCheck.
	NoCheck bool
	// Limit and Mode are the wait's kind: Limit above 1 a semaphore slot of
	// N = Limit, Mode a side of a read/write lock; both zero (or Limit 1)
	// for a plain key.
	Limit uint32
	Mode  Mode
}

// Hold is a session's grant of a key: a plain grant, a semaphore slot or a
// side of a read/write lock.
type Hold struct {
	Session SessionID
	Key     string
	// Mode is the side a read/write holder holds; ModeUnset for a plain
	// grant or a semaphore slot.
	Mode Mode
}

// WaitGraph is one consistent snapshot of a backend's waits and grants, of
// every kind.
type WaitGraph struct {
	Waits []Wait
	Holds []Hold
}

// Deadlock is one deadlocked set FindDeadlocks found: Victim is the wait
// to refuse, Keys the keys of the set's inside waits (sorted, no
// duplicates).
type Deadlock struct {
	Victim Wait
	Keys   []string
}
