package client_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/client"
)

// TestReconnectFollowsBackoff: the connection re-dials a replica that drops
// every connection on the SDK's backoff (C2 #ct2-failover, "Reconnects of the
// connection itself"), not on gRPC's default schedule (1 s growing ×1.6 to
// 120 s), which after a rolling restart left a client without a connection
// for longer than its sessions' TTL.
//
// The listener counts connection attempts: it accepts each and closes it at
// once (no server preface, so the attempt fails and gRPC backs off). A call
// under way keeps the channel out of idle; from then on gRPC re-dials by
// itself. The gap before attempt k+1 is at most the SDK's backoff d_k =
// min(min<<(k-1), max); the bound allows d_k + 1 s for a loaded 2-core machine
// under -race. gRPC's default gap before attempt 3 is at least 1.28 s (1.6 s
// less its 20% jitter), above the bound of 1.04 s, so the old dial fails here
// at attempt 3 whatever the load.
func TestReconnectFollowsBackoff(t *testing.T) {
	const (
		minWait  = 20 * time.Millisecond
		maxWait  = 200 * time.Millisecond
		slack    = time.Second
		attempts = 8
	)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dials := make(chan time.Time, 64)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // exits when the listener closes (cleanup below)
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case dials <- time.Now():
			default:
			}
			_ = conn.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })

	c, err := client.New(ln.Addr().String(), client.WithBackoff(minWait, maxWait))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { // a call under way: retries until cancel below
		defer close(done)
		_, _ = c.Inspect(ctx, "reconnect/k")
	}()
	defer func() {
		cancel()
		<-done
		_ = c.Close()
	}()

	var last time.Time
	select {
	case last = <-dials:
	case <-time.After(10 * time.Second):
		t.Fatal("no connection attempt within 10s of a call")
	}
	for k := 1; k < attempts; k++ {
		d := min(minWait<<(k-1), maxWait)
		bound := d + slack
		select {
		case at := <-dials:
			last = at
		case <-time.After(bound - time.Since(last)):
			t.Fatalf("no connection attempt %d within %v of attempt %d (SDK backoff at most %v)", k+1, bound, k, d)
		}
	}
}
