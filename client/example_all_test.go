package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
)

// AcquireAll takes several locks at once, or none: a job moving money
// between two accounts holds both, each with its own fencing token, and two
// jobs naming the accounts in opposite orders never deadlock (the server
// takes the keys in ascending order).
func ExampleSession_AcquireAll() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	s, err := c.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	locks, err := s.AcquireAll(ctx, []string{"accounts/bob", "accounts/alice"})
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range locks {
		fmt.Println("holding", l.Key(), "token > 0:", l.Token() > 0)
	}

	// Another session's try of an overlapping set takes nothing.
	other, err := c.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close(ctx)
	_, err = other.TryAcquireAll(ctx, []string{"accounts/alice", "accounts/carol"})
	fmt.Println("locked:", errors.Is(err, client.ErrLocked))
	carol, err := c.Inspect(ctx, "accounts/carol")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("carol held:", carol.Held)

	fmt.Println("released:", client.ReleaseAll(ctx, locks))
	// Output:
	// holding accounts/bob token > 0: true
	// holding accounts/alice token > 0: true
	// locked: true
	// carol held: false
	// released: <nil>
}
