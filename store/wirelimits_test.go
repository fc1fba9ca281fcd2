package store_test

import (
	"errors"
	"testing"

	"lock.dev/lockd/proto/lockd/v1/wirelimits"
	"lock.dev/lockd/store"
)

// TestWireLimitsReexported checks that the store's validation vocabulary is
// the wire's (issue 22): one sentinel and one error type, so errors.Is and
// errors.As with the store's names match the wire checks' errors (which the
// SDK returns as its own) and the other way round.
func TestWireLimitsReexported(t *testing.T) {
	if store.ErrInvalidArgument != wirelimits.ErrInvalidArgument {
		t.Fatalf("store.ErrInvalidArgument (%v) is not wirelimits.ErrInvalidArgument", store.ErrInvalidArgument)
	}
	wireErr := wirelimits.ValidateKey("")
	if ie, ok := errors.AsType[*store.InvalidError](wireErr); !ok || ie.Problem != "key is empty" {
		t.Errorf("errors.As(%v, *store.InvalidError) = %v, %v; want the problem", wireErr, ie, ok)
	}
	if !errors.Is(wireErr, store.ErrInvalidArgument) {
		t.Errorf("errors.Is(%v, store.ErrInvalidArgument) = false", wireErr)
	}
	storeErr := store.ValidateGrantPolicy(store.GrantPolicy{MaxHold: 1})
	if ie, ok := errors.AsType[*wirelimits.InvalidError](storeErr); !ok || ie.Problem == "" {
		t.Errorf("errors.As(%v, *wirelimits.InvalidError) = %v, %v; want the problem", storeErr, ie, ok)
	}
	if _, err := store.NewAcquireOptions(store.WithLimit(store.MaxLimit + 1)); !errors.Is(err, wirelimits.ErrInvalidArgument) {
		t.Errorf("NewAcquireOptions(limit %d) = %v; want wirelimits.ErrInvalidArgument", store.MaxLimit+1, err)
	}
}
