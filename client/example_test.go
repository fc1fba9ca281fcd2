package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/lockdtest"
)

// The examples run against an in-process lockd (lockdtest.ExampleAddr); a
// real program dials its server, e.g. client.New("127.0.0.1:7420").

// Do runs a function while holding a lock, and releases it afterwards. The
// function's context is cancelled if the lock is lost.
func ExampleDo() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	err = client.Do(ctx, c, "reports/nightly", func(ctx context.Context) error {
		token, _ := client.TokenFromContext(ctx)
		// Hand token to the resource so that it rejects older holders.
		fmt.Println("have the lock, token > 0:", token > 0)
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// have the lock, token > 0: true
	// err: <nil>
}

// A session holds locks for as long as it is trusted; work under
// Lock.Context stops when the lock is lost.
func ExampleSession_Acquire() {
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

	l, err := s.Acquire(ctx, "jobs/compaction", client.WithWaitTimeout(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	select {
	case <-l.Context().Done():
		fmt.Println("lost the lock:", l.Err())
	case <-time.After(10 * time.Millisecond): // the work
		fmt.Println("work done under token", l.Token() > 0)
	}
	if err := l.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("released:", l.Err())
	// Output:
	// work done under token true
	// released: client: lock released
}

// TryAcquire does not wait: a held key is ErrLocked.
func ExampleSession_TryAcquire() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	a, _ := c.NewSession(ctx)
	b, _ := c.NewSession(ctx)
	defer a.Close(ctx)
	defer b.Close(ctx)

	if _, err := a.TryAcquire(ctx, "singleton"); err != nil {
		log.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, "singleton")
	fmt.Println("second session locked out:", errors.Is(err, client.ErrLocked))
	// Output:
	// second session locked out: true
}

// Watch reports what happens to the keys under a prefix.
func ExampleClient_Watch() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	events, err := c.Watch(ctx, "watched/")
	if err != nil {
		log.Fatal(err)
	}
	s, _ := c.NewSession(ctx)
	defer s.Close(context.Background())
	l, _ := s.Acquire(ctx, "watched/a")
	_ = l.Release(ctx)
	if _, err := c.Revoke(ctx, "watched/a"); err != nil { // nothing to revoke now
		log.Fatal(err)
	}
	for range 2 {
		ev := <-events
		fmt.Println(ev.Kind, ev.Key)
	}
	// Output:
	// acquired watched/a
	// released watched/a
}

// A lock for a resource that cannot check fencing tokens: if the lock ends
// without a release (the session expires, an administrator revokes it, or
// it is held longer than its maximum hold), nobody else gets the key for
// the lock-delay, so a holder that has not noticed yet has that long to
// stop. WithMaxHold makes the server revoke a lock held too long; Lock.Err
// then matches ErrMaxHold.
func ExampleWithLockDelay() {
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

	l, err := s.Acquire(ctx, "jobs/legacy-export",
		client.WithLockDelay(10*time.Second), client.WithMaxHold(time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	info, err := c.Inspect(ctx, "jobs/legacy-export")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("lock-delay:", info.LockDelay)
	// A normal release hands the key over at once.
	fmt.Println("release:", l.Release(ctx))
	fmt.Println("lost to its maximum hold:", errors.Is(l.Err(), client.ErrMaxHold))
	// Output:
	// lock-delay: 10s
	// release: <nil>
	// lost to its maximum hold: false
}
