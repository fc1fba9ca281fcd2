package store

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestValidateKey(t *testing.T) {
	tests := []struct {
		name, key string
		ok        bool
	}{
		{"simple", "jobs/nightly", true},
		{"one byte", "k", true},
		{"max length", strings.Repeat("k", MaxKeyLen), true},
		{"multibyte", "ключ/日本", true},
		{"empty", "", false},
		{"too long", strings.Repeat("k", MaxKeyLen+1), false},
		{"invalid utf8", "a\xffb", false},
		{"NUL", "a\x00b", false},
	}
	for _, tc := range tests {
		err := ValidateKey(tc.key)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateKey(%s) = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ValidateKey(%s) = %v, want it to wrap ErrInvalidArgument", tc.name, err)
		}
	}
}

// TestInvalidError checks that a validation error says what is wrong as data
// and keeps the text "store: invalid argument: <problem>".
func TestInvalidError(t *testing.T) {
	for _, err := range []error{ValidateKey(""), ValidatePrefix("a\x00"), ValidateTTL(0),
		ValidateSessionID(""), func() error { _, err := ListLimit(-1); return err }()} {
		var ie *InvalidError
		if !errors.As(err, &ie) || ie.Problem == "" || !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%v: want an *InvalidError with a problem, matching ErrInvalidArgument", err)
			continue
		}
		if want := "store: invalid argument: " + ie.Problem; !strings.HasSuffix(err.Error(), want) {
			t.Errorf("%q does not end with %q", err, want)
		}
	}
	var ie *InvalidError
	if !errors.As(ValidateKey(""), &ie) || ie.Problem != "key is empty" {
		t.Errorf("ValidateKey(\"\") = %v; want an *InvalidError with problem %q", ValidateKey(""), "key is empty")
	}
}

func TestValidateTTL(t *testing.T) {
	for ttl, ok := range map[time.Duration]bool{
		MinTTL: true, MaxTTL: true, 15 * time.Second: true, 2500 * time.Millisecond: true,
		0: false, MinTTL - time.Millisecond: false, MaxTTL + time.Millisecond: false, 2*time.Second + time.Microsecond: false,
	} {
		if err := ValidateTTL(ttl); (err == nil) != ok || (err != nil && !errors.Is(err, ErrInvalidArgument)) {
			t.Errorf("ValidateTTL(%v) = %v, want ok=%v", ttl, err, ok)
		}
	}
}

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{ErrContention, true},
		{ErrNotLeader, true},
		{ErrUnavailable, true},
		{errors.Join(ErrUnavailable, errors.New("dial tcp: refused")), true},
		{ErrSessionDead, false},
		{errors.Join(ErrSessionDead, ErrContention), false},
		{ErrNotOwner, false},
		{ErrInvalidArgument, false},
	} {
		if got := IsRetryable(tc.err); got != tc.want {
			t.Errorf("IsRetryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if !errors.Is(ErrUnavailable, ErrContention) || errors.Is(ErrContention, ErrUnavailable) {
		t.Error("ErrUnavailable must be a kind of ErrContention, not the reverse")
	}
}

func TestNewSessionID(t *testing.T) {
	seen := map[SessionID]bool{}
	for range 1000 {
		id := NewSessionID()
		if len(id) < 26 || ValidateSessionID(id) != nil || seen[id] {
			t.Fatalf("NewSessionID() = %q: want 26 valid, unique characters", id)
		}
		seen[id] = true
	}
}

// FuzzValidateKey checks the key rules against an independent statement of
// them; it must never panic.
func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{"", "k", "a/b/c", "a\x00b", "\xff", strings.Repeat("x", 513), "日本"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := ValidateKey(key)
		want := len(key) >= 1 && len(key) <= MaxKeyLen && utf8.ValidString(key) && !strings.ContainsRune(key, 0)
		if (err == nil) != want {
			t.Fatalf("ValidateKey(%q) = %v, want ok=%v", key, err, want)
		}
		if err != nil && !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("ValidateKey(%q) = %v, not ErrInvalidArgument", key, err)
		}
	})
}
