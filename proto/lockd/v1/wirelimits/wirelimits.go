// Package wirelimits is the bounds of lockd's request fields and the checks
// of them: keys and prefixes, session TTLs, owner, labels and value, a
// grant's lock-delay and maximum hold, a semaphore's N, a List page. One
// implementation, used by every layer: the SDK (lock.dev/lockd/client)
// checks a request with it before sending it, and the storage SPI
// (lock.dev/lockd/store) re-exports every name of it (store.ValidateKey,
// store.MaxKeyLen, store.InvalidError, store.ErrInvalidArgument, …), which
// the server and the backends check with. The contract is C2 #ct2-keys,
// #ct2-holder, #ct2-delay and #ct2-multi.
//
// It is written by hand next to the generated package lockdv1 and the
// wire-error vocabulary wireerr, imports the standard library only, and
// exists so that a program that links the SDK links neither the storage SPI
// nor anything of the server (internal/testing/archtest pins it).
package wirelimits

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
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

// Holder identity bounds (C2 #ct2-holder). The server, the SDK and every
// backend check them with ValidateOwner, ValidateLabels and ValidateValue.
const (
	// MaxOwnerBytes bounds a session's owner string.
	MaxOwnerBytes = 128
	// MaxLabels bounds how many labels a session carries.
	MaxLabels = 8
	// MaxLabelBytes bounds each label key and each label value.
	MaxLabelBytes = 64
	// MaxValueBytes bounds the value attached to a grant.
	MaxValueBytes = 4096
)

// Bounds of a grant policy (C2 #ct2-delay).
const (
	// MaxLockDelay bounds a grant's lock-delay.
	MaxLockDelay = time.Hour
	// MinMaxHold and MaxMaxHold bound a non-zero maximum hold.
	MinMaxHold = time.Second
	MaxMaxHold = 168 * time.Hour
)

// MaxLimit bounds a semaphore's N (C2 #ct2-multi).
const MaxLimit = 1024

// ErrInvalidArgument: the request itself is wrong (bad key, TTL out of
// range, bad limit). It is the storage SPI's sentinel, defined here so that
// InvalidError can match it without this package importing the store:
// store.ErrInvalidArgument is this very value, and its text is the SPI's.
var ErrInvalidArgument = errors.New("store: invalid argument")

// InvalidError is an ErrInvalidArgument that says what is wrong as data
// (e.g. "key is empty"), so the server and the SDK can name the request field
// without editing error text. The checks of this package return it;
// store.InvalidError is this type.
type InvalidError struct {
	Problem string
}

func (e *InvalidError) Error() string { return ErrInvalidArgument.Error() + ": " + e.Problem }
func (e *InvalidError) Unwrap() error { return ErrInvalidArgument }

func invalidf(format string, args ...any) error {
	return &InvalidError{Problem: fmt.Sprintf(format, args...)}
}

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

// ValidateOwner checks an owner string: at most MaxOwnerBytes of printable
// UTF-8 (no control characters, so it is safe to print).
func ValidateOwner(owner string) error {
	if len(owner) > MaxOwnerBytes {
		return invalidf("owner is %d bytes, at most %d allowed", len(owner), MaxOwnerBytes)
	}
	if !printable(owner) {
		return invalidf("owner is not printable UTF-8")
	}
	return nil
}

// ValidateLabels checks a session's labels: at most MaxLabels of them, each
// key 1..MaxLabelBytes and each value at most MaxLabelBytes of printable
// UTF-8.
func ValidateLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return invalidf("labels has %d entries, at most %d allowed", len(labels), MaxLabels)
	}
	for k, v := range labels {
		switch {
		case k == "":
			return invalidf("labels has an empty key")
		case len(k) > MaxLabelBytes:
			return invalidf("labels key is %d bytes, at most %d allowed", len(k), MaxLabelBytes)
		case len(v) > MaxLabelBytes:
			return invalidf("labels value of %q is %d bytes, at most %d allowed", k, len(v), MaxLabelBytes)
		case !printable(k) || !printable(v):
			return invalidf("labels entry %q is not printable UTF-8", k)
		}
	}
	return nil
}

// ValidateValue checks a grant's value: at most MaxValueBytes of any bytes.
func ValidateValue(value []byte) error {
	if len(value) > MaxValueBytes {
		return invalidf("value is %d bytes, at most %d allowed", len(value), MaxValueBytes)
	}
	return nil
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// ValidateLockDelay checks a grant's lock-delay: 0..MaxLockDelay, whole
// milliseconds.
func ValidateLockDelay(d time.Duration) error {
	switch {
	case d < 0 || d > MaxLockDelay:
		return invalidf("lock delay %v out of range [0, %v]", d, MaxLockDelay)
	case d%time.Millisecond != 0:
		return invalidf("lock delay %v is not a whole number of milliseconds", d)
	}
	return nil
}

// ValidateMaxHold checks a grant's maximum hold: 0 (none) or
// MinMaxHold..MaxMaxHold, whole milliseconds.
func ValidateMaxHold(d time.Duration) error {
	switch {
	case d != 0 && (d < MinMaxHold || d > MaxMaxHold):
		return invalidf("max hold %v out of range: 0 or [%v, %v]", d, MinMaxHold, MaxMaxHold)
	case d%time.Millisecond != 0:
		return invalidf("max hold %v is not a whole number of milliseconds", d)
	}
	return nil
}

// MaxAcquireKeys bounds the keys of one multi-key acquire (C2
// #ct2-acquire-all).
const MaxAcquireKeys = 64

// ValidateKeys checks the keys of a multi-key acquire (C2
// #ct2-acquire-all): 1..MaxAcquireKeys keys, each valid (ValidateKey), no
// key twice.
func ValidateKeys(keys []string) error {
	switch {
	case len(keys) == 0:
		return invalidf("keys is empty")
	case len(keys) > MaxAcquireKeys:
		return invalidf("%d keys, at most %d allowed", len(keys), MaxAcquireKeys)
	}
	seen := make(map[string]bool, len(keys))
	for i, k := range keys {
		if err := ValidateKey(k); err != nil {
			return invalidf("keys[%d]: %s", i, err.(*InvalidError).Problem)
		}
		if seen[k] {
			return invalidf("keys[%d]: key %q given twice", i, k)
		}
		seen[k] = true
	}
	return nil
}
