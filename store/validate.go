package store

import (
	"time"

	"lock.dev/lockd/proto/lockd/v1/wirelimits"
)

// Limits shared by every layer (C2 #ct2-keys, #ct2-spi). They and the
// checks of keys, TTLs, holders and grant policies are those of package
// wirelimits (the wire's bounds, which the SDK checks without linking this
// package), re-exported here.
const (
	// MaxKeyLen is the longest key, in bytes.
	MaxKeyLen = wirelimits.MaxKeyLen
	// MinTTL and MaxTTL bound a session's TTL (C5 lock.session.ttl).
	MinTTL = wirelimits.MinTTL
	MaxTTL = wirelimits.MaxTTL
	// DefaultListLimit and MaxListLimit bound one page of List.
	DefaultListLimit = wirelimits.DefaultListLimit
	MaxListLimit     = wirelimits.MaxListLimit
)

// ValidateKey is the one key check used by the store, the server and the SDK
// (C2 #ct2-keys; wirelimits.ValidateKey): valid UTF-8, 1..MaxKeyLen bytes,
// no NUL byte. The error is an *InvalidError (so it matches
// ErrInvalidArgument) that says what is wrong; so are the errors of the
// other checks below.
func ValidateKey(key string) error { return wirelimits.ValidateKey(key) }

// ValidatePrefix checks a List/Watch prefix: like a key, but may be empty
// (meaning every key).
func ValidatePrefix(prefix string) error { return wirelimits.ValidatePrefix(prefix) }

// ValidateTTL checks a session TTL against [MinTTL, MaxTTL] and requires
// whole milliseconds.
func ValidateTTL(ttl time.Duration) error { return wirelimits.ValidateTTL(ttl) }

// ValidateSessionID rejects ids that no backend could have issued: empty,
// longer than 128 bytes, or not printable ASCII. It does not say whether the
// session exists.
func ValidateSessionID(id SessionID) error {
	if id == "" || len(id) > 128 {
		return invalidf("session id must be 1..128 bytes")
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return invalidf("session id has a byte outside printable ASCII")
		}
	}
	return nil
}

// ListLimit resolves a List limit: 0 means DefaultListLimit; negative or
// above MaxListLimit is ErrInvalidArgument.
func ListLimit(limit int) (int, error) {
	switch {
	case limit == 0:
		return DefaultListLimit, nil
	case limit < 0 || limit > MaxListLimit:
		return 0, invalidf("limit %d out of range [1, %d]", limit, MaxListLimit)
	}
	return limit, nil
}
