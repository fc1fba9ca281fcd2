package server

import (
	"context"
	"fmt"

	"lock.dev/lockd/internal/auth"
)

// The caller's read filter: under an access policy (C5 #ct5-auth) every
// authorised call's context carries the per-key read check of its caller.
// HotKeys filters its rankings with it, and the one place errors are mapped
// to the wire (errors.go) keeps the keys of other sessions that an error
// would name to those the caller may read (C2 #ct2-deadlock).

type readFilterKey struct{}

// withReadFilter returns ctx carrying principal's per-key read check,
// decided against the policy in force when it is called.
func withReadFilter(ctx context.Context, az *auth.Authorizer, principal string) context.Context {
	return context.WithValue(ctx, readFilterKey{}, func(key string) bool {
		ok, _ := az.Decide(principal, auth.ActionRead, key)
		return ok
	})
}

// readFilterNeeded tells authorize whether a call must carry the per-key
// read check: not when it reads under a prefix all of which its caller may
// read (wholePrefix: Scope said all), where the check would answer yes for
// every key it is asked about (HotKeys ranks only keys under the prefix)
// at the cost of one policy decision each; always for a call on one key
// (an Acquire's DEADLOCK may name keys anywhere) or another action.
func readFilterNeeded(act auth.Action, wholePrefix bool) bool {
	return !wholePrefix || act != auth.ActionRead
}

// readFilter is the read check of ctx's caller; nil (every key readable)
// without an access policy.
func readFilter(ctx context.Context) func(key string) bool {
	f, _ := ctx.Value(readFilterKey{}).(func(string) bool)
	return f
}

// readable splits keys into those ctx's caller may read, in order, and the
// number of the others.
func readable(ctx context.Context, keys []string) (shown []string, withheld int) {
	allow := readFilter(ctx)
	if allow == nil {
		return keys, 0
	}
	shown = make([]string, 0, len(keys))
	for _, k := range keys {
		if allow(k) {
			shown = append(shown, k)
		} else {
			withheld++
		}
	}
	return shown, withheld
}

// deadlockMessage is the message of a DEADLOCK refusal naming the cycle's
// keys the caller may read (shown) and counting the others.
func deadlockMessage(shown []string, withheld int) string {
	const head, tail = "deadlock: the wait closes a cycle of waiting sessions over ", " (C2 #ct2-deadlock)"
	hidden := fmt.Sprintf("%d key", withheld)
	if withheld != 1 {
		hidden += "s"
	}
	hidden += " you may not read"
	switch {
	case withheld == 0:
		return fmt.Sprintf("%skeys %q%s", head, shown, tail)
	case len(shown) == 0:
		return head + hidden + tail
	}
	return fmt.Sprintf("%skeys %q and %s%s", head, shown, hidden, tail)
}
