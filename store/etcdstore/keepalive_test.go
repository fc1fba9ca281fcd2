package etcdstore

import (
	"testing"
	"time"
)

// TestKeepaliveInterval: a third of the TTL, at most maxKeepaliveInterval,
// and always well inside the overdue bound of the previous answer's TTL.
func TestKeepaliveInterval(t *testing.T) {
	for ttl, want := range map[time.Duration]time.Duration{
		2 * time.Second:  2 * time.Second / 3,
		6 * time.Second:  2 * time.Second,
		9 * time.Second:  3 * time.Second,
		15 * time.Second: 3 * time.Second,
		time.Hour:        3 * time.Second,
	} {
		got := keepaliveInterval(ttl)
		if got != want {
			t.Errorf("keepaliveInterval(%v) = %v, want %v", ttl, got, want)
		}
		if got > ttl/3 {
			t.Errorf("keepaliveInterval(%v) = %v, more than a third of the TTL", ttl, got)
		}
	}
}
