package server

import (
	"context"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/status"

	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/store"
)

// TestDeadlockMessage: the message of a DEADLOCK refusal names the shown
// keys and counts the withheld ones (C2 #ct2-deadlock); with none
// withheld it is the message without a policy.
func TestDeadlockMessage(t *testing.T) {
	for _, c := range []struct {
		shown    []string
		withheld int
		want     string
	}{
		{[]string{"a", "b"}, 0, `deadlock: the wait closes a cycle of waiting sessions over keys ["a" "b"] (C2 #ct2-deadlock)`},
		{[]string{"a/1"}, 1, `deadlock: the wait closes a cycle of waiting sessions over keys ["a/1"] and 1 key you may not read (C2 #ct2-deadlock)`},
		{[]string{"a/1"}, 2, `deadlock: the wait closes a cycle of waiting sessions over keys ["a/1"] and 2 keys you may not read (C2 #ct2-deadlock)`},
		{[]string{}, 3, `deadlock: the wait closes a cycle of waiting sessions over 3 keys you may not read (C2 #ct2-deadlock)`},
	} {
		if got := deadlockMessage(c.shown, c.withheld); got != c.want {
			t.Errorf("deadlockMessage(%q, %d) = %q; want %q", c.shown, c.withheld, got, c.want)
		}
	}
}

// TestDeadlockKeysFilteredOnce: a DEADLOCK refusal's message and its status
// details name the same keys even when the caller's read check changes
// between two looks (a policy reload): the keys are filtered once.
func TestDeadlockKeysFilteredOnce(t *testing.T) {
	looks := 0
	allow := func(key string) bool { // a reload after the first look: nothing readable
		if key == "a" {
			looks++
		}
		return looks <= 1
	}
	ctx := context.WithValue(context.Background(), readFilterKey{}, allow)
	err := (&Server{ctx: context.Background()}).toStatus(ctx, "Acquire", &store.DeadlockError{Keys: []string{"a", "b"}})
	st := status.Convert(err)
	keys, ok := wireerr.DeadlockKeys(st)
	if !ok {
		t.Fatalf("not a DEADLOCK status: %v", err)
	}
	named := !strings.Contains(st.Message(), "2 keys you may not read")
	if named != (len(keys) == 2) || (len(keys) != 0 && !slices.Equal(keys, []string{"a", "b"})) {
		t.Fatalf("message %q and details %q name different keys", st.Message(), keys)
	}
	if looks != 1 {
		t.Fatalf("the read check looked at the cycle %d times; want once", looks)
	}
}
