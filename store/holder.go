package store

import (
	"context"
	"maps"

	"lock.dev/lockd/proto/lockd/v1/wirelimits"
)

// Holder identity bounds (C2 #ct2-holder), those of package wirelimits. The
// server, the SDK and every backend check them with ValidateOwner,
// ValidateLabels and ValidateValue.
const (
	// MaxOwnerBytes bounds a session's owner string.
	MaxOwnerBytes = wirelimits.MaxOwnerBytes
	// MaxLabels bounds how many labels a session carries.
	MaxLabels = wirelimits.MaxLabels
	// MaxLabelBytes bounds each label key and each label value.
	MaxLabelBytes = wirelimits.MaxLabelBytes
	// MaxValueBytes bounds the value attached to a grant.
	MaxValueBytes = wirelimits.MaxValueBytes
)

// WithOwner records who holds the session's locks (C2 #ct2-holder): a
// free-form owner string ("web-3 (pid 812)") and a few labels. OpenSession
// copies both and validates them (ErrInvalidArgument). They are stored
// where every store instance reads them, and Inspect and List report them
// on the session's grants.
func WithOwner(owner string, labels map[string]string) SessionOption {
	return func(o *SessionOptions) {
		o.Owner = owner
		o.Labels = maps.Clone(labels)
	}
}

// ValidateOwner checks an owner string: at most MaxOwnerBytes of printable
// UTF-8 (no control characters, so it is safe to print).
func ValidateOwner(owner string) error { return wirelimits.ValidateOwner(owner) }

// ValidateLabels checks a session's labels: at most MaxLabels of them, each
// key 1..MaxLabelBytes and each value at most MaxLabelBytes of printable
// UTF-8.
func ValidateLabels(labels map[string]string) error { return wirelimits.ValidateLabels(labels) }

// ValidateValue checks a grant's value: at most MaxValueBytes of any bytes.
func ValidateValue(value []byte) error { return wirelimits.ValidateValue(value) }

// ValueSetter attaches a value to a grant (C2 #ct2-holder). It is a part of
// LockStore of its own so that the grant paths (TryInsert, Acquire, the
// hand-over of a release) and their fencing tokens stay as they are: the
// server calls SetValue right after a grant that came with a value.
type ValueSetter interface {
	// SetValue attaches value (ValidateValue) to the grant (session, key,
	// token), replacing any earlier value of it, without changing the grant
	// or its token. It is ErrNotOwner unless that exact grant is the
	// current one (like DeleteIfOwner). Inspect and List report the value of
	// the current grant only: a value never outlives its grant.
	SetValue(ctx context.Context, id SessionID, key string, token uint64, value []byte) error
}
