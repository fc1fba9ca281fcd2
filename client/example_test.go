package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
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

// Campaign waits in the election's FIFO queue until this session leads;
// the leader's fencing token guards what it writes, Proclaim publishes a new
// value without an election, and Resign hands over to the next candidate.
func ExampleSession_Campaign() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	s, err := c.NewSession(ctx, client.WithOwner("web-3", nil))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	lead, err := s.Campaign(ctx, "election/api", []byte("http://web-3:8080"))
	if err != nil {
		log.Fatal(err)
	}
	token := lead.Token() // hand it to the resources the leader writes to
	if err := lead.Proclaim(ctx, []byte("http://web-3:9090")); err != nil {
		log.Fatal(err)
	}
	fmt.Println("same token after Proclaim:", lead.Token() == token)
	select {
	case <-lead.Done(): // lost: stop acting as leader at once
		fmt.Println("deposed:", lead.Err())
	default:
		fmt.Println("leading with", string(lead.Value()))
	}
	if err := lead.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// same token after Proclaim: true
	// leading with http://web-3:9090
}

// Observe reports the leader of an election, its value and token, and "no
// leader" when there is none.
func ExampleClient_Observe() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	leaders, err := c.Observe(ctx, "election/db")
	if err != nil {
		log.Fatal(err)
	}
	show := func(o client.Observation) {
		if !o.Leader {
			fmt.Println("no leader")
			return
		}
		fmt.Printf("leader %s: %s\n", o.Owner, o.Value)
	}
	show(<-leaders) // the current state

	s, _ := c.NewSession(ctx, client.WithOwner("db-1", nil))
	defer s.Close(context.Background())
	lead, _ := s.Campaign(ctx, "election/db", []byte("primary at db-1:5432"))
	for o := range leaders {
		if o.Leader && len(o.Value) > 0 { // the value may follow the grant
			show(o)
			break
		}
	}
	_ = lead.Resign(ctx)
	show(<-leaders)
	// Output:
	// no leader
	// leader db-1: primary at db-1:5432
	// no leader
}

// WithLimit makes a key a counting semaphore: here at most two sessions
// run an export at once, each with its own fencing token; a third waits
// (or, with TryAcquire, is ErrLocked). Every caller of the key must use
// the same limit.
func ExampleWithLimit() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	var locks []*client.Lock
	for range 3 {
		s, err := c.NewSession(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close(ctx)
		l, err := s.TryAcquire(ctx, "examples/exports", client.WithLimit(2))
		if errors.Is(err, client.ErrLocked) {
			fmt.Println("third session: both slots taken")
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		locks = append(locks, l)
	}
	fmt.Println("holders:", len(locks), "distinct tokens:", locks[0].Token() != locks[1].Token())

	info, err := c.Inspect(ctx, "examples/exports")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("inspect: limit", info.Limit, "holders", len(info.Holders))

	s, _ := c.NewSession(ctx)
	defer s.Close(ctx)
	_, err = s.TryAcquire(ctx, "examples/exports", client.WithLimit(3))
	fmt.Println("another limit:", errors.Is(err, client.ErrLimitMismatch))
	// Output:
	// third session: both slots taken
	// holders: 2 distinct tokens: true
	// inspect: limit 2 holders 2
	// another limit: true
}

// Shared and Exclusive make a key a read/write lock: readers hold it
// together, a writer alone. A waiting writer blocks later readers, and its
// token is above every earlier reader's, so a resource that remembers the
// highest writer token can turn away a reader from before the write.
func ExampleShared() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	open := func() *client.Session {
		s, err := c.NewSession(ctx)
		if err != nil {
			log.Fatal(err)
		}
		return s
	}
	r1, r2, w := open(), open(), open()
	defer r1.Close(ctx)
	defer r2.Close(ctx)
	defer w.Close(ctx)

	l1, err := r1.Acquire(ctx, "examples/catalog", client.Shared())
	if err != nil {
		log.Fatal(err)
	}
	l2, err := r2.Acquire(ctx, "examples/catalog", client.Shared())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("two readers at once")

	_, err = w.TryAcquire(ctx, "examples/catalog", client.Exclusive())
	fmt.Println("writer while readers hold:", errors.Is(err, client.ErrLocked))

	_ = l1.Release(ctx)
	_ = l2.Release(ctx)
	lw, err := w.Acquire(ctx, "examples/catalog", client.Exclusive())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("writer token above the readers':", lw.Token() > l1.Token() && lw.Token() > l2.Token())
	// Output:
	// two readers at once
	// writer while readers hold: true
	// writer token above the readers': true
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
