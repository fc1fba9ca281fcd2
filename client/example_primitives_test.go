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

// Examples of the calls and options of issue #15: holder identity, values,
// leader hand-over, read/write locks, maximum hold, a session's lock-delay,
// listing sessions. They run against the in-process lockd (ExampleAddr).

// waitQueued polls until key has n waiters (an example's stand-in for "the
// other candidate is in line by now").
func waitQueued(ctx context.Context, c *client.Client, key string, n int) {
	for {
		info, err := c.Inspect(ctx, key)
		if err != nil {
			log.Fatal(err)
		}
		if len(info.Waiters) >= n {
			return
		}
		select {
		case <-ctx.Done():
			log.Fatal(ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// WithOwner names who holds a session's locks: Inspect, List and the
// ErrLocked of another session's TryAcquire show the owner and labels.
func ExampleWithOwner() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	s, err := c.NewSession(ctx, client.WithOwner("web-3 (pid 812)", map[string]string{"deploy": "api"}))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	if _, err := s.Acquire(ctx, "examples/owner"); err != nil {
		log.Fatal(err)
	}

	info, err := c.Inspect(ctx, "examples/owner")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held by", info.Owner, "deploy", info.Labels["deploy"])

	other, err := c.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close(ctx)
	_, err = other.TryAcquire(ctx, "examples/owner")
	fmt.Println("locked:", errors.Is(err, client.ErrLocked))
	// Output:
	// held by web-3 (pid 812) deploy api
	// locked: true
}

// WithValue attaches a value to the grant — what the holder is doing, where
// it serves — for whoever may read the key: Inspect and List show it.
func ExampleWithValue() {
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
	if _, err := s.Acquire(ctx, "examples/reindex", client.WithValue([]byte("shard 7"))); err != nil {
		log.Fatal(err)
	}
	info, err := c.Inspect(ctx, "examples/reindex")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("value %q\n", info.Value)
	// Output:
	// value "shard 7"
}

// Holder is the one-line description of a key's holder that lockd's own
// messages use: the owner (else the session) and the token.
func ExampleLockInfo_Holder() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	s, err := c.NewSession(ctx, client.WithOwner("cron@host-2", nil))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	l, err := s.Acquire(ctx, "examples/holder")
	if err != nil {
		log.Fatal(err)
	}
	info, err := c.Inspect(ctx, "examples/holder")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.Holder() == fmt.Sprintf("cron@host-2 token %d", l.Token()))
	// Output:
	// true
}

// WithValue attaches a value to a grant, and Lock.SetValue replaces it
// later without giving up the lock: the token stays.
func ExampleLock_SetValue() {
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
	l, err := s.Acquire(ctx, "examples/value", client.WithValue([]byte("step 1 of 3")))
	if err != nil {
		log.Fatal(err)
	}
	if err := l.SetValue(ctx, []byte("step 2 of 3")); err != nil {
		log.Fatal(err)
	}
	info, err := c.Inspect(ctx, "examples/value")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("value %q, same token: %v\n", info.Value, info.Token == l.Token())
	// Output:
	// value "step 2 of 3", same token: true
}

// WithHolders makes Watch report who was granted a key, with the grant's
// value, and every new value (EventValue).
func ExampleWithHolders() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	events, err := c.Watch(ctx, "examples/holders", client.WithHolders())
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.NewSession(ctx, client.WithOwner("backup-7", nil))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(context.Background())
	l, err := s.Acquire(ctx, "examples/holders", client.WithValue([]byte("started")))
	if err != nil {
		log.Fatal(err)
	}
	ev := <-events
	fmt.Println(ev.Kind, "by", ev.Owner)
	if err := l.SetValue(ctx, []byte("half done")); err != nil {
		log.Fatal(err)
	}
	for ev := range events {
		if ev.Kind == client.EventValue && string(ev.Value) == "half done" {
			fmt.Println(ev.Kind, string(ev.Value))
			break
		}
	}
	// Output:
	// acquired by backup-7
	// value half done
}

// Resign hands the leadership to the next candidate in line at once; the
// new leader's token is higher, so resources reject the old leader.
func ExampleLeadership_Resign() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	a, err := c.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close(ctx)
	b, err := c.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close(ctx)

	first, err := a.Campaign(ctx, "examples/election", []byte("a"))
	if err != nil {
		log.Fatal(err)
	}
	next := make(chan *client.Leadership, 1)
	go func() {
		lead, err := b.Campaign(ctx, "examples/election", []byte("b"))
		if err != nil {
			log.Fatal(err)
		}
		next <- lead
	}()
	waitQueued(ctx, c, "examples/election", 1)

	if err := first.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("first:", first.Err())
	second := <-next
	fmt.Printf("second leads with %s, higher token: %v\n", second.Value(), second.Token() > first.Token())
	if err := second.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// first: client: lock released
	// second leads with b, higher token: true
}

// Exclusive is the writer side of a read/write lock. A writer that waits
// keeps later readers out even while earlier readers still hold the key,
// so writers do not starve.
func ExampleExclusive() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	var sessions []*client.Session
	for range 3 {
		s, err := c.NewSession(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close(ctx)
		sessions = append(sessions, s)
	}
	reader, writer, late := sessions[0], sessions[1], sessions[2]

	r, err := reader.Acquire(ctx, "examples/schema", client.Shared())
	if err != nil {
		log.Fatal(err)
	}
	granted := make(chan *client.Lock, 1)
	go func() {
		w, err := writer.Acquire(ctx, "examples/schema", client.Exclusive())
		if err != nil {
			log.Fatal(err)
		}
		granted <- w
	}()
	waitQueued(ctx, c, "examples/schema", 1)

	_, err = late.TryAcquire(ctx, "examples/schema", client.Shared())
	fmt.Println("later reader while a writer waits:", errors.Is(err, client.ErrLocked))

	if err := r.Release(ctx); err != nil {
		log.Fatal(err)
	}
	w := <-granted
	fmt.Println("writer holds alone, token above the reader's:", w.Token() > r.Token())
	if err := w.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// later reader while a writer waits: true
	// writer holds alone, token above the reader's: true
}

// WithMaxHold makes the server revoke a lock held too long, even if its
// holder is wedged: Done closes and Err matches ErrMaxHold.
func ExampleWithMaxHold() {
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

	l, err := s.Acquire(ctx, "examples/wedged", client.WithMaxHold(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	<-l.Done() // a job that never finishes
	fmt.Println("revoked for holding too long:", errors.Is(l.Err(), client.ErrMaxHold))
	fmt.Println("session still usable:", s.Err() == nil)
	// Output:
	// revoked for holding too long: true
	// session still usable: true
}

// WithSessionLockDelay gives every plain lock of a session a lock-delay
// unless its Acquire sets one; semaphore slots and read/write sides get
// none.
func ExampleWithSessionLockDelay() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	s, err := c.NewSession(ctx, client.WithSessionLockDelay(15*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	if _, err := s.Acquire(ctx, "examples/legacy-a"); err != nil {
		log.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "examples/legacy-b", client.WithLockDelay(2*time.Second)); err != nil {
		log.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "examples/pool", client.WithLimit(4)); err != nil {
		log.Fatal(err)
	}
	for _, key := range []string{"examples/legacy-a", "examples/legacy-b", "examples/pool"} {
		info, err := c.Inspect(ctx, key)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(key, "lock-delay", info.LockDelay)
	}
	// Output:
	// examples/legacy-a lock-delay 15s
	// examples/legacy-b lock-delay 2s
	// examples/pool lock-delay 0s
}

// ListSessions pages through the live sessions the caller may see: its
// own, or every one for an administrator.
func ExampleClient_ListSessions() {
	c, err := client.New(lockdtest.ExampleAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	s, err := c.NewSession(ctx, client.WithOwner("report-runner", nil))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	if _, err := s.Acquire(ctx, "examples/report"); err != nil {
		log.Fatal(err)
	}

	page := ""
	for {
		sessions, next, err := c.ListSessions(ctx, client.ListSessionsOptions{PageToken: page})
		if err != nil {
			log.Fatal(err)
		}
		for _, si := range sessions {
			if si.ID == s.ID() {
				fmt.Println(si.Owner, "holds", si.Locks, "lock(s), TTL", si.TTL)
			}
		}
		if next == "" {
			break
		}
		page = next
	}
	// Output:
	// report-runner holds 1 lock(s), TTL 3s
}
