package store

import (
	"fmt"
	"slices"
	"time"

	"lock.dev/lockd/proto/lockd/v1/wirelimits"
)

// MaxLimit bounds a semaphore's N (C2 #ct2-multi; wirelimits.MaxLimit).
const MaxLimit = wirelimits.MaxLimit

// Mode is the side of a read/write lock an acquire asks for (C2
// #ct2-multi).
type Mode uint8

const (
	// ModeUnset: not a read/write lock — the plain exclusive lock, or a
	// semaphore slot with WithLimit.
	ModeUnset Mode = iota
	// ModeExclusive: the writer side of a read/write lock; no other holder
	// at once.
	ModeExclusive
	// ModeShared: the reader side of a read/write lock; held together with
	// other shared holders, never with an exclusive one.
	ModeShared
)

var modeNames = [...]string{"", "exclusive", "shared"}

func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// AcquireOption configures Acquire and TryInsert.
type AcquireOption func(*AcquireOptions)

// AcquireOptions are what Acquire's options set. Backends read them with
// NewAcquireOptions.
type AcquireOptions struct {
	// Limit is the semaphore's N; 0 and 1 mean one holder.
	Limit uint32
	// Mode is the read/write side; ModeUnset for none.
	Mode Mode
	// KeepPlace: an Acquire that ends without a grant for any reason but
	// the session's end leaves the session's queue entry in place
	// (KeepPlace, C2 #ct2-keep-place).
	KeepPlace bool
	// NoDeadlockCheck: the wait is never refused as a deadlock's victim
	// (NoDeadlockCheck, C2 #ct2-deadlock).
	NoDeadlockCheck bool
}

// WithLimit makes the grant one of up to n slots of a counting semaphore
// (C2 #ct2-multi): up to n sessions hold the key at once, each with its own
// fencing token; the rest wait in FIFO order. 0 and 1 are the plain
// exclusive lock. Every caller of one key must use the same n while the key
// has holders or waiters (ErrLimitMismatch).
func WithLimit(n uint32) AcquireOption {
	return func(o *AcquireOptions) { o.Limit = n }
}

// WithMode makes the grant a side of a read/write lock (C2 #ct2-multi):
// many ModeShared holders or one ModeExclusive holder, FIFO with writer
// preference.
func WithMode(m Mode) AcquireOption {
	return func(o *AcquireOptions) { o.Mode = m }
}

// NewAcquireOptions applies opts and checks the result: a limit above
// MaxLimit, an unknown mode, or a mode with a limit above 1 is
// ErrInvalidArgument. The limit is normalised: 0 becomes 1.
func NewAcquireOptions(opts ...AcquireOption) (AcquireOptions, error) {
	var o AcquireOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	switch {
	case o.Limit > MaxLimit:
		return AcquireOptions{}, invalidf("limit is %d, at most %d allowed", o.Limit, MaxLimit)
	case o.Mode > ModeShared:
		return AcquireOptions{}, invalidf("mode %d is unknown", uint8(o.Mode))
	case o.Mode != ModeUnset && o.Limit > 1:
		return AcquireOptions{}, invalidf("a %s (read/write) request takes no limit; got %d", o.Mode, o.Limit)
	}
	if o.Limit == 0 {
		o.Limit = 1
	}
	return o, nil
}

// Multi reports whether the options ask for a semaphore slot or a side of
// a read/write lock rather than the plain exclusive lock.
func (o AcquireOptions) Multi() bool { return o.Limit > 1 || o.Mode != ModeUnset }

// RW reports whether the options ask for a side of a read/write lock.
func (o AcquireOptions) RW() bool { return o.Mode != ModeUnset }

// HolderInfo is one holder of a semaphore or read/write key (LockInfo.Holders).
type HolderInfo struct {
	Session    SessionID
	Token      uint64
	Mode       Mode
	AcquiredAt time.Time
	// Owner, Labels and Value as in LockInfo (C2 #ct2-holder).
	Owner  string
	Labels map[string]string
	Value  []byte
}

// MultiEntry is one holder or waiter of a semaphore or read/write key, as
// a backend reads it for Admit.
type MultiEntry struct {
	Session SessionID
	Limit   uint32
	Mode    Mode
}

// Verdict is what Admit decides about a request.
type Verdict int

const (
	// AdmitGrant: grant the request now.
	AdmitGrant Verdict = iota + 1
	// AdmitWait: queue (Acquire) or report the key busy (TryInsert).
	AdmitWait
	// AdmitMismatch: the request's kind differs from the key's
	// (ErrLimitMismatch).
	AdmitMismatch
)

// Admit is the admission rule of semaphores and read/write locks (C2
// #ct2-multi), one function for every backend. holders are the key's
// current holders, queue its waiters in FIFO order (the request's own
// entry, if queued, included); o the request of session id. A request not
// in the queue is granted iff the queue is empty and it is compatible with
// every holder; a queued one iff it is compatible with the holders together
// with every waiter ahead of it (so the admissible waiters are a prefix of
// the queue, and granting any of them keeps the others admissible). It is a
// mismatch iff any holder or waiter uses another limit or another kind.
func Admit(id SessionID, o AcquireOptions, holders, queue []MultiEntry) Verdict {
	for _, e := range append(holders[:len(holders):len(holders)], queue...) {
		if e.Limit != o.Limit || (e.Mode != ModeUnset) != o.RW() {
			return AdmitMismatch
		}
	}
	pos := slices.IndexFunc(queue, func(e MultiEntry) bool { return e.Session == id })
	if pos < 0 && len(queue) > 0 {
		return AdmitWait // not queued: only on an empty queue
	}
	ahead := queue[:max(pos, 0)]
	switch {
	case !o.RW():
		if len(holders)+len(ahead) >= int(o.Limit) {
			return AdmitWait
		}
	case o.Mode == ModeExclusive:
		if len(holders) > 0 || len(ahead) > 0 {
			return AdmitWait
		}
	default:
		for _, e := range append(holders[:len(holders):len(holders)], ahead...) {
			if e.Mode == ModeExclusive {
				return AdmitWait
			}
		}
	}
	return AdmitGrant
}
