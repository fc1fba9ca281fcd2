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

// SetGranter is the optional one-commit grant of a set of free keys (C2
// #ct2-acquire-all) that AcquireAllInOrder tries first when st has it.
// GrantFree grants the session every key of keys (sorted, distinct, none
// held by the session) in ONE backend commit iff every key is free: no
// holder, nobody queued, no semaphore or read/write entry, no lock-delay
// running. It returns the grants in the order of keys with granted true;
// granted false and a nil error when a key is not free or the set is too
// large for one commit — then nothing was written. An error leaves the
// outcome unknown (the commit may have happened): the caller looks.
type SetGranter interface {
	GrantFree(ctx context.Context, id SessionID, keys []string) (grants []Grant, granted bool, err error)
}

// undoTimeout bounds the cleanup of a failed AcquireAll: the caller's
// context may be done, the cleanup runs on one of its own.
const undoTimeout = 5 * time.Second

// AcquireAllInOrder is AcquireAll (C2 #ct2-acquire-all) over the one-key
// calls of st, the one algorithm of every backend. When st is a SetGranter
// and the session holds none of keys, it first tries to grant them all in
// one commit (GrantFree); if a key is not free it goes on as below. It takes keys in
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
	if sg, ok := st.(SetGranter); ok && !heldAny(held, sorted) {
		gs, ok, err := sg.GrantFree(ctx, id, sorted)
		if err != nil {
			undoAll(ctx, st, id, nil, sorted, held, err)
			return nil, false, fmt.Errorf("keys %q: %w", sorted, err)
		}
		if ok {
			for _, g := range gs {
				got[g.Key] = g
			}
			return inOrder(keys, got, sorted), true, nil
		}
		// A key is not free: the ordered per-key path decides.
	}
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
			undoAll(ctx, st, id, made, []string{k}, held, err)
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
	return inOrder(keys, got, sorted), true, nil
}

// inOrder is the grants of got in the order of keys. Every grant carries
// the bound the last one (of sorted) proved: measured from a later receipt
// than any earlier grant's, it understates none of them.
func inOrder(keys []string, got map[string]Grant, sorted []string) []Grant {
	last := got[sorted[len(sorted)-1]].Remaining
	out := make([]Grant, len(keys))
	for i, k := range keys {
		out[i] = got[k]
		out[i].Remaining = last
	}
	return out
}

// heldAny reports whether the session held a key of keys before the call.
func heldAny(held map[string]uint64, keys []string) bool {
	for _, k := range keys {
		if _, ok := held[k]; ok {
			return true
		}
	}
	return false
}

// undoAll releases the grants a failed AcquireAll made. failed are the
// keys whose call failed with cause (nil: busy): a grant of one of them
// that the failed call may have made all the same (its answer lost to the
// ended ctx) is looked for in the session's held set and released too,
// unless the session held it before the call. A dead session's grants are gone
// with it; nothing to do.
func undoAll(ctx context.Context, st SingleKeyStore, id SessionID, made []Grant, failed []string, held map[string]uint64, cause error) {
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
		if t, ok := held[g.Key]; slices.Contains(failed, g.Key) && (!ok || t != g.Token) {
			_ = st.DeleteIfOwner(uctx, id, g.Key, g.Token)
		}
	}
}
