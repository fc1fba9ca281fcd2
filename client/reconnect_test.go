package client_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/client"
)

// TestReconnectBackoffWithinMax: while its server is away, the client's
// connection attempts follow its own backoff (WithBackoff's max, C2 #ct2-sdk
// rule 11), not gRPC's default connection backoff (1 s growing by 1.6 up to
// 120 s), so a server that comes back after a long outage is reached within
// about max of its return. The address answers every connection by closing
// it (a server that is not there yet); the test counts the attempts while a
// call retries for 5 s. gRPC's default makes its third attempt at least
// 2.05 s after the second; with max 200 ms no gap comes near 1 s.
func TestReconnectBackoffWithinMax(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		attempts []time.Time
	)
	accepted := make(chan struct{})
	go func() { // exits when the listener is closed
		defer close(accepted)
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			attempts = append(attempts, time.Now())
			mu.Unlock()
			_ = conn.Close()
		}
	}()
	c, err := client.New(lis.Addr().String(), client.WithBackoff(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Inspect(ctx, "k"); err == nil {
		t.Fatal("Inspect answered by an address that closes every connection")
	}
	_ = lis.Close()
	<-accepted

	mu.Lock()
	defer mu.Unlock()
	var longest time.Duration
	for i := 1; i < len(attempts); i++ {
		longest = max(longest, attempts[i].Sub(attempts[i-1]))
	}
	const bound = time.Second // max 200 ms plus jitter, with room for a loaded machine
	if len(attempts) < 5 || longest > bound {
		t.Errorf("%d connection attempts in 5 s, the longest gap %v; want at least 5 and no gap over %v (the backoff's max is 200 ms)",
			len(attempts), longest.Round(time.Millisecond), bound)
	}
}
