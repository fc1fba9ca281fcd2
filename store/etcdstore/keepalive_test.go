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

// TestNextSendAfter: the next keepalive is due at least the interval after
// the send, less than a tick later than that, and on the keeper's grid.
func TestNextSendAfter(t *testing.T) {
	k := &keeper{epoch: time.Now()}
	for _, off := range []time.Duration{0, time.Nanosecond, 37 * time.Millisecond, sendTick, 12345 * time.Millisecond} {
		for _, ttl := range []time.Duration{2 * time.Second, 15 * time.Second} {
			sent := k.epoch.Add(off)
			at := k.nextSendAfter(sent, ttl)
			if d := at.Sub(sent); d < keepaliveInterval(ttl) || d >= keepaliveInterval(ttl)+sendTick {
				t.Errorf("nextSendAfter(epoch+%v, %v) = sent+%v, want in [%v, %v)", off, ttl, d, keepaliveInterval(ttl), keepaliveInterval(ttl)+sendTick)
			}
			if at.Sub(k.epoch)%sendTick != 0 {
				t.Errorf("nextSendAfter(epoch+%v, %v) = epoch+%v, not on the %v grid", off, ttl, at.Sub(k.epoch), sendTick)
			}
		}
	}
}
