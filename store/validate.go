package store

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits shared by every layer (C2 #ct2-keys, #ct2-spi).
const (
	// MaxKeyLen is the longest key, in bytes.
	MaxKeyLen = 512
	// MinTTL and MaxTTL bound a session's TTL (C5 lock.session.ttl).
	MinTTL = 2 * time.Second
	MaxTTL = time.Hour
	// DefaultListLimit and MaxListLimit bound one page of List.
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// ValidateKey is the one key check used by the store, the server and the SDK
// (C2 #ct2-keys): valid UTF-8, 1..MaxKeyLen bytes, no NUL byte. The error
// is an *InvalidError (so it matches ErrInvalidArgument) that says what is
// wrong; so are the errors of the other checks below.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return invalidf("key is empty")
	case len(key) > MaxKeyLen:
		return invalidf("key is %d bytes, at most %d allowed", len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return invalidf("key is not valid UTF-8")
	case strings.IndexByte(key, 0) >= 0:
		return invalidf("key contains a NUL byte")
	}
	return nil
}

// ValidatePrefix checks a List/Watch prefix: like a key, but may be empty
// (meaning every key).
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if err := ValidateKey(prefix); err != nil {
		return fmt.Errorf("prefix: %w", err)
	}
	return nil
}

// ValidateTTL checks a session TTL against [MinTTL, MaxTTL] and requires
// whole milliseconds.
func ValidateTTL(ttl time.Duration) error {
	switch {
	case ttl < MinTTL || ttl > MaxTTL:
		return invalidf("ttl %v out of range [%v, %v]", ttl, MinTTL, MaxTTL)
	case ttl%time.Millisecond != 0:
		return invalidf("ttl %v is not a whole number of milliseconds", ttl)
	}
	return nil
}

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
