package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"lock.dev/lockd/proto/lockd/v1/wirelimits"
)

// MaxAcquireKeys bounds the keys of one AcquireAll (C2 #ct2-acquire-all;
// wirelimits.MaxAcquireKeys).
const MaxAcquireKeys = wirelimits.MaxAcquireKeys

// ValidateKeys checks the keys of an AcquireAll: 1..MaxAcquireKeys keys,
// each valid, no key twice (wirelimits.ValidateKeys).
func ValidateKeys(keys []string) error { return wirelimits.ValidateKeys(keys) }

// SingleKeyStore is the part of a LockStore that AcquireAllInOrder builds
// on: the one-key grant calls, the held set and the release.
type SingleKeyStore interface {
	TryInsert(ctx context.Context, id SessionID, key string, opts ...AcquireOption) (Grant, bool, error)
	Acquire(ctx context.Context, id SessionID, key string, opts ...AcquireOption) (Grant, error)
	LocksOf(ctx context.Context, id SessionID) ([]Grant, error)
	DeleteIfOwner(ctx context.Context, id SessionID, key string, token uint64) error
}

// undoTimeout bounds the cleanup of a failed AcquireAll: the caller's
// context may be done, the cleanup runs on one of its own.
const undoTimeout = 5 * time.Second

// AcquireAllInOrder is AcquireAll (C2 #ct2-acquire-all) over the one-key
// calls of st, the one algorithm of every backend: it takes keys in
// ascending byte order, each with Acquire (wait) or TryInsert (!wait),
// so that a session waits only for a key above every key it holds in the
// call and AcquireAll callers never wait on each other in a cycle. It
// returns one grant per key in the order of keys, or none: on an error, a
// busy key (!wait: acquired false, nil error) or an ended ctx, it releases
// every grant it made before it returns. Keys the session held before the
// call are returned with their grant and never released. The one option
// is NoDeadlockCheck, passed to every key's Acquire; any other is
// ErrInvalidArgument.
func AcquireAllInOrder(ctx context.Context, st SingleKeyStore, id SessionID, keys []string, wait bool, opts ...AcquireOption) ([]Grant, bool, error) {
	if err := ValidateKeys(keys); err != nil {
		return nil, false, err
	}
	var each []AcquireOption // every key's Acquire
	switch o, err := NewAcquireOptions(opts...); {
	case err != nil:
		return nil, false, err
	case o.Limit > 1 || o.Mode != ModeUnset || o.KeepPlace:
		return nil, false, fmt.Errorf("%w: AcquireAll takes no option but NoDeadlockCheck (C2 #ct2-acquire-all)", ErrInvalidArgument)
	case o.NoDeadlockCheck:
		each = append(each, NoDeadlockCheck())
	}
	if err := ValidateSessionID(id); err != nil {
		return nil, false, err
	}
	before, err := st.LocksOf(ctx, id)
	if err != nil {
		return nil, false, err
	}
	held := make(map[string]uint64, len(before)) // key → token held before the call
	for _, g := range before {
		held[g.Key] = g.Token
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	got := make(map[string]Grant, len(keys))
	var made []Grant // grants this call made, in the order made
	for _, k := range sorted {
		var (
			g  Grant
			ok = true
		)
		if wait {
			g, err = st.Acquire(ctx, id, k, each...)
		} else {
			g, ok, err = st.TryInsert(ctx, id, k)
		}
		if err != nil || !ok {
			undoAll(ctx, st, id, made, k, held, err)
			if err != nil {
				return nil, false, fmt.Errorf("key %q: %w", k, err)
			}
			return nil, false, nil
		}
		if t, ok := held[k]; !ok || t != g.Token {
			made = append(made, g)
		}
		got[k] = g
	}
	// Every grant carries the bound the last one proved: measured from a
	// later receipt than any earlier grant's, it understates none of them.
	last := got[sorted[len(sorted)-1]].Remaining
	out := make([]Grant, len(keys))
	for i, k := range keys {
		out[i] = got[k]
		out[i].Remaining = last
	}
	return out, true, nil
}

// undoAll releases the grants a failed AcquireAll made. failedKey is the
// key whose call failed with cause (nil: busy): a grant of it that the
// failed call may have made all the same (its answer lost to the ended
// ctx) is looked for in the session's held set and released too, unless
// the session held it before the call. A dead session's grants are gone
// with it; nothing to do.
func undoAll(ctx context.Context, st SingleKeyStore, id SessionID, made []Grant, failedKey string, held map[string]uint64, cause error) {
	if errors.Is(cause, ErrSessionDead) {
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	for _, g := range made {
		_ = st.DeleteIfOwner(uctx, id, g.Key, g.Token) // a failure leaves it to the session's end
	}
	if cause == nil {
		return
	}
	now, err := st.LocksOf(uctx, id)
	if err != nil {
		return
	}
	for _, g := range now {
		if t, ok := held[g.Key]; g.Key == failedKey && (!ok || t != g.Token) {
			_ = st.DeleteIfOwner(uctx, id, g.Key, g.Token)
		}
	}
}
