package wirelimits_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/proto/lockd/v1/wirelimits"
)

// TestChecks runs every check at and just past its bounds: the bound is
// accepted, one past it is an *InvalidError that matches ErrInvalidArgument
// and reads "store: invalid argument: <problem>".
func TestChecks(t *testing.T) {
	w := wirelimits.ValidateLabels
	tests := []struct {
		name string
		err  error
		ok   bool
	}{
		{"key max", wirelimits.ValidateKey(strings.Repeat("k", wirelimits.MaxKeyLen)), true},
		{"key too long", wirelimits.ValidateKey(strings.Repeat("k", wirelimits.MaxKeyLen+1)), false},
		{"key empty", wirelimits.ValidateKey(""), false},
		{"key NUL", wirelimits.ValidateKey("a\x00"), false},
		{"key bad utf8", wirelimits.ValidateKey("a\xff"), false},
		{"prefix empty", wirelimits.ValidatePrefix(""), true},
		{"prefix NUL", wirelimits.ValidatePrefix("a\x00"), false},
		{"ttl min", wirelimits.ValidateTTL(wirelimits.MinTTL), true},
		{"ttl max", wirelimits.ValidateTTL(wirelimits.MaxTTL), true},
		{"ttl short", wirelimits.ValidateTTL(wirelimits.MinTTL - time.Millisecond), false},
		{"ttl long", wirelimits.ValidateTTL(wirelimits.MaxTTL + time.Millisecond), false},
		{"ttl sub-ms", wirelimits.ValidateTTL(wirelimits.MinTTL + time.Microsecond), false},
		{"owner max", wirelimits.ValidateOwner(strings.Repeat("o", wirelimits.MaxOwnerBytes)), true},
		{"owner long", wirelimits.ValidateOwner(strings.Repeat("o", wirelimits.MaxOwnerBytes+1)), false},
		{"owner control", wirelimits.ValidateOwner("a\nb"), false},
		{"labels nil", w(nil), true},
		{"labels empty key", w(map[string]string{"": "v"}), false},
		{"labels long value", w(map[string]string{"k": strings.Repeat("v", wirelimits.MaxLabelBytes+1)}), false},
		{"value max", wirelimits.ValidateValue(make([]byte, wirelimits.MaxValueBytes)), true},
		{"value long", wirelimits.ValidateValue(make([]byte, wirelimits.MaxValueBytes+1)), false},
		{"lock delay max", wirelimits.ValidateLockDelay(wirelimits.MaxLockDelay), true},
		{"lock delay negative", wirelimits.ValidateLockDelay(-time.Millisecond), false},
		{"lock delay sub-ms", wirelimits.ValidateLockDelay(time.Microsecond), false},
		{"max hold none", wirelimits.ValidateMaxHold(0), true},
		{"max hold min", wirelimits.ValidateMaxHold(wirelimits.MinMaxHold), true},
		{"max hold short", wirelimits.ValidateMaxHold(wirelimits.MinMaxHold - time.Millisecond), false},
		{"max hold long", wirelimits.ValidateMaxHold(wirelimits.MaxMaxHold + time.Millisecond), false},
	}
	for _, tc := range tests {
		if (tc.err == nil) != tc.ok {
			t.Errorf("%s: err = %v, want ok=%v", tc.name, tc.err, tc.ok)
			continue
		}
		if tc.err == nil {
			continue
		}
		ie, ok := errors.AsType[*wirelimits.InvalidError](tc.err)
		if !ok || ie.Problem == "" || !errors.Is(tc.err, wirelimits.ErrInvalidArgument) {
			t.Errorf("%s: err = %#v, want an *InvalidError with a problem that matches ErrInvalidArgument", tc.name, tc.err)
		}
		if !strings.HasPrefix(tc.err.Error(), "store: invalid argument: ") && !strings.HasPrefix(tc.err.Error(), "prefix: store: invalid argument: ") {
			t.Errorf("%s: err = %q, want the text store: invalid argument: <problem>", tc.name, tc.err)
		}
	}
}
