package etcdstore

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
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

// sample is one heartbeat: when it was called and returned, and its reply.
type sample struct {
	start, end time.Time
	l          store.Liveness
	err        error
}

func beat(st *Store, id store.SessionID) sample {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := sample{start: time.Now()}
	s.l, s.err = st.Heartbeat(ctx, id)
	s.end = time.Now()
	return s
}

// TestOutageShorterThanTTL cuts, then pauses, the store's connection to etcd
// for less than the TTL: heartbeat never reports not-live (only retryable
// errors), Remaining never grows without an answer, and the locks survive.
func TestOutageShorterThanTTL(t *testing.T) {
	const ttl = 5 * time.Second
	const outage = 2 * time.Second
	for _, mode := range []string{"cut", "pause"} {
		t.Run(mode, func(t *testing.T) {
			prefix := etcdtest.Prefix(t)
			p := etcdtest.NewProxy(t)
			st := newStore(t, etcdtest.NewClient(t, etcdtest.ProxyEndpoint(p)), prefix, nil)
			direct := etcdtest.NewClient(t)
			id := openSession(t, st, ttl)
			for _, k := range []string{"x", "y"} {
				mustTry(t, st, id, k)
			}

			if mode == "cut" {
				p.Cut()
			} else {
				p.Pause()
			}
			began := time.Now()
			var prev *sample
			for time.Since(began) < outage {
				s := beat(st, id)
				switch {
				case s.err != nil && !store.IsRetryable(s.err):
					t.Fatalf("Heartbeat during a %v outage: %v; want a retryable error or live", time.Since(began), s.err)
				case s.err == nil && !s.l.Live:
					t.Fatalf("Heartbeat during a %v outage (TTL %v) reported not live", time.Since(began), ttl)
				case s.err == nil:
					if s.l.Remaining > ttl {
						t.Fatalf("Remaining %v > TTL %v", s.l.Remaining, ttl)
					}
					// No answer can arrive: the bound may only shrink.
					// prev's bound ends by prev.end+Remaining; this one
					// starts no earlier than s.start+Remaining.
					if prev != nil && s.start.Add(s.l.Remaining).After(prev.end.Add(prev.l.Remaining)) {
						t.Fatalf("Remaining grew without an answer: %v at %v, then %v at %v",
							prev.l.Remaining, prev.start.Sub(began), s.l.Remaining, s.start.Sub(began))
					}
					prev = &s
				}
				time.Sleep(50 * time.Millisecond) // polling interval
			}
			p.Restore()

			testkit.Eventually(t, ttl, "a fresh keepalive answer after the outage", func() error {
				s := beat(st, id)
				switch {
				case s.err != nil:
					return s.err
				case !s.l.Live:
					t.Fatalf("Heartbeat after the outage reported not live")
				case s.l.Remaining < ttl-ttl/3-time.Second:
					return errors.New("bound not refreshed yet")
				}
				return nil
			})
			if got := lockKeys(t, direct, prefix); len(got) != 2 {
				t.Fatalf("grant keys after a short outage: %v, want x and y", got)
			}
		})
	}
}

// TestOutagePermanent cuts the store off etcd for good: within about the
// TTL heartbeat reports not-live (keepalive_failed), and stays so after the
// network returns; the lease is then gone and its keys with it.
func TestOutagePermanent(t *testing.T) {
	const ttl = 3 * time.Second
	prefix := etcdtest.Prefix(t)
	p := etcdtest.NewProxy(t)
	logs := &testkit.LogBuffer{}
	st := newStore(t, etcdtest.NewClient(t, etcdtest.ProxyEndpoint(p)), prefix, slog.New(slog.NewJSONHandler(logs, nil)))
	direct := etcdtest.NewClient(t)
	id := openSession(t, st, ttl)
	mustTry(t, st, id, "k")

	p.Cut()
	cut := time.Now()
	var notLive time.Duration
	testkit.Eventually(t, ttl+3*time.Second, "heartbeat not live during a permanent outage", func() error {
		s := beat(st, id)
		if s.err != nil {
			if !store.IsRetryable(s.err) {
				t.Fatalf("Heartbeat during the outage: %v; want retryable", s.err)
			}
			return s.err
		}
		if s.l.Live {
			return errors.New("still live")
		}
		notLive = time.Since(cut)
		return nil
	})
	t.Logf("not live %v after the cut (TTL %v)", notLive.Round(time.Millisecond), ttl)
	// The last answered keepalive was sent at most TTL/3 (+ its round trip)
	// before the cut, so its bound lasts past cut + 2·TTL/3.
	if notLive < ttl/2 {
		t.Fatalf("not live %v after the cut: before the bound of the last answered keepalive could have run out", notLive)
	}
	if !strings.Contains(logs.String(), `"msg":"session_lost"`) || !strings.Contains(logs.String(), `"reason":"keepalive_failed"`) {
		t.Fatalf("logs lack session_lost with reason keepalive_failed:\n%s", logs.String())
	}

	p.Restore()
	testkit.Eventually(t, ttl+2*time.Second, "the given-up session's key is gone once etcd is back", func() error {
		if got := lockKeys(t, direct, prefix); len(got) != 0 {
			return errors.New("key still there")
		}
		return nil
	})
	if s := beat(st, id); s.err != nil || s.l.Live {
		t.Fatalf("Heartbeat after the network returned = %+v, %v; not-live is terminal", s.l, s.err)
	}
	if _, _, err := st.TryInsert(ctxT(t), id, "k2"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("TryInsert on the given-up session: %v, want ErrSessionDead", err)
	}
}

// TestRemainingWhileHealthy: Remaining stays in (0, TTL] and is refreshed
// by the keepalive stream without any Heartbeat sending anything.
func TestRemainingWhileHealthy(t *testing.T) {
	const ttl = 2 * time.Second
	st := newStore(t, etcdtest.NewClient(t), etcdtest.Prefix(t), nil)
	id := openSession(t, st, ttl)
	began := time.Now()
	for time.Since(began) < 2*ttl {
		s := beat(st, id)
		if s.err != nil || !s.l.Live {
			t.Fatalf("Heartbeat at %v = %+v, %v; want live", time.Since(began), s.l, s.err)
		}
		if s.l.Remaining <= 0 || s.l.Remaining > ttl {
			t.Fatalf("Remaining %v at %v, want in (0, %v]", s.l.Remaining, time.Since(began), ttl)
		}
		time.Sleep(100 * time.Millisecond) // polling interval
	}
}
