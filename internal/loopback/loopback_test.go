package loopback

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePorts: n distinct ports, each bindable once handed out.
func TestFreePorts(t *testing.T) {
	ports, err := FreePorts(8)
	if err != nil {
		t.Fatalf("FreePorts(8): %v", err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("FreePorts(8) = %v: want 8 distinct ports", ports)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d handed out, not bindable: %v", p, err)
		}
		l.Close()
	}
	if p, err := FreePort(); err != nil || p <= 0 {
		t.Fatalf("FreePort() = %d, %v", p, err)
	}
}
