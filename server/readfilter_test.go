package server

import "testing"

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
