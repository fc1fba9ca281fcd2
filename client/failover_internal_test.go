package client

import (
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/resolver"
)

// TestSetAsideWhenEveryOtherIsAside: with every other address set aside, a
// draining replica is left all the same (the others' asides forgotten: the
// last step of a rolling restart), a stalled one is kept (C2
// #ct2-failover): every replica slow must not make the client hop.
func TestSetAsideWhenEveryOtherIsAside(t *testing.T) {
	now := time.Unix(1000, 0)
	r := newFailoverResolver([]string{"127.0.0.1:1", "127.0.0.1:2"}, "", func() time.Time { return now })
	r.update([]resolver.Address{{Addr: "127.0.0.1:1"}, {Addr: "127.0.0.1:2"}})
	a := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
	b := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2}

	if !r.setAside(a, false) {
		t.Fatal("A stalls, B is not aside: setAside(A) = false; want a move to B")
	}
	if r.setAside(b, false) {
		t.Fatal("B stalls while A is aside: setAside(B) = true; want the client to stay (no hopping between slow replicas)")
	}
	if !r.setAside(b, true) {
		t.Fatal("B drains while A is aside: setAside(B) = false; want a move to A (its aside forgotten)")
	}
	r.mu.Lock()
	_, aAside := r.aside["127.0.0.1:1"]
	_, bAside := r.aside["127.0.0.1:2"]
	r.mu.Unlock()
	if aAside || !bAside {
		t.Fatalf("after B drained: A aside %v, B aside %v; want only B", aAside, bAside)
	}
	if r.setAside(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 3}, true) {
		t.Fatal("setAside of an unknown address = true; want false")
	}
}
