package store_test

import (
	"context"
	"errors"
	"testing"

	"lock.dev/lockd/store"
)

// TestAcquireAllInOrderOptions: NoDeadlockCheck is the one option
// AcquireAll takes (C2 #ct2-acquire-all); any other is ErrInvalidArgument
// before the store is asked (a nil SingleKeyStore would panic if it were).
func TestAcquireAllInOrderOptions(t *testing.T) {
	for name, opt := range map[string]store.AcquireOption{
		"limit":      store.WithLimit(2),
		"mode":       store.WithMode(store.ModeShared),
		"keep-place": store.KeepPlace(),
	} {
		_, _, err := store.AcquireAllInOrder(context.Background(), nil, store.NewSessionID(), []string{"a", "b"}, true, opt)
		if !errors.Is(err, store.ErrInvalidArgument) {
			t.Errorf("%s: %v; want ErrInvalidArgument", name, err)
		}
	}
}
