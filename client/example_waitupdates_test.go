package client_test

import (
	"context"
	"fmt"
	"log"
	"sync"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
)

// WithWaitUpdates reports a waiting Acquire's place in the queue, and the
// server's estimate of the wait once it has seen holds of the key (C2
// #ct2-wait-updates). Here the holder lets go once the waiter is next in
// line.
func ExampleWithWaitUpdates() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	holder, err := c.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer holder.Close(ctx)
	held, err := holder.Acquire(ctx, "reports/weekly")
	if err != nil {
		log.Fatal(err)
	}

	s, err := c.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	var release sync.Once
	l, err := s.Acquire(ctx, "reports/weekly", client.WithWaitUpdates(0, func(u client.WaitUpdate) {
		if u.Err != nil || u.Position != 1 {
			return // a failed read, or not queued yet
		}
		fmt.Printf("position %d of %d\n", u.Position, u.Waiters) // and u.Estimate, when u.HasEstimate
		release.Do(func() { _ = held.Release(ctx) })
	}))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("acquired after the holder:", l.Token() > held.Token())
	_ = l.Release(ctx)
	// Output:
	// position 1 of 1
	// acquired after the holder: true
}
