package client_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// observations reads an Observe channel for a test.
type observations struct {
	t   *testing.T
	ch  <-chan client.Observation
	top uint64 // highest leader token seen
	log []string
}

func (o *observations) String() string { return fmt.Sprint(o.log) }

// until reads observations until want holds and returns that one; every
// observation before it must satisfy allowed. Leader tokens never go down.
func (o *observations) until(what string, allowed, want func(client.Observation) bool) client.Observation {
	o.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ob, ok := <-o.ch:
			if !ok || ob.Err != nil {
				o.t.Fatalf("%s: observe ended (%v) after %v", what, ob.Err, o)
			}
			desc := "no leader"
			if ob.Leader {
				desc = fmt.Sprintf("%s/%d/%q", ob.Owner, ob.Token, ob.Value)
				if ob.Token < o.top {
					o.t.Fatalf("%s: leader token went down to %d after %v", what, ob.Token, o)
				}
				o.top = ob.Token
			}
			o.log = append(o.log, desc)
			if want(ob) {
				return ob
			}
			if !allowed(ob) {
				o.t.Fatalf("%s: unexpected observation %s (all: %v)", what, desc, o)
			}
		case <-timeout:
			o.t.Fatalf("%s: not observed; saw %v", what, o)
		}
	}
}

func noLeader(ob client.Observation) bool { return !ob.Leader }

func leaderIs(owner string, token uint64, value string) func(client.Observation) bool {
	return func(ob client.Observation) bool {
		return ob.Leader && ob.Owner == owner && (token == 0 || ob.Token == token) && bytes.Equal(ob.Value, []byte(value))
	}
}

// leaderAny matches owner's leadership with any value (the acquired event
// may come before the grant's value is set).
func leaderAny(owner string) func(client.Observation) bool {
	return func(ob client.Observation) bool { return ob.Leader && ob.Owner == owner }
}

func either(fs ...func(client.Observation) bool) func(client.Observation) bool {
	return func(ob client.Observation) bool {
		for _, f := range fs {
			if f(ob) {
				return true
			}
		}
		return false
	}
}

// TestElection: issue #15 §2 (C2 #ct2-election) on both backends. Three
// candidates campaign in order; Observe reports no leader, then the first
// with its value; Proclaim changes the value and keeps the token; the
// leader's connection goes silent, so it loses its session: its Done
// closes, Observe reports no leader, then the second candidate (FIFO) with
// a higher token; Resign hands over to the third; its Resign leaves no
// leader.
func TestElection(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testCtx(t, 2*time.Minute)
		const name = "elect/e"
		ch, err := srv.Client.Observe(ctx, name)
		if err != nil {
			t.Fatalf("Observe: %v", err)
		}
		obs := &observations{t: t, ch: ch}
		obs.until("the first observation", func(client.Observation) bool { return false }, noLeader)

		// Each candidate has a connection of its own, through a proxy.
		type candidate struct {
			proxy *testkit.Proxy
			s     *client.Session
			got   chan *client.Leadership
		}
		cands := make([]*candidate, 3)
		var l0 *client.Leadership
		for i := range cands {
			p := testkit.NewProxy(t, srv.Addr)
			c := srv.NewClient(t)
			if i == 0 {
				var err error
				c, err = client.New(p.Addr(), client.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					p.Restore()
					_ = c.Close()
				})
			}
			sopts := []client.SessionOption{client.WithOwner(fmt.Sprintf("cand-%d", i), nil)}
			if i > 0 {
				// Only cand-0's expiry is the subject: the others must
				// outlive a starved test process (longTTL).
				sopts = append(sopts, client.WithSessionTTL(longTTL))
			}
			cand := &candidate{proxy: p, s: newSession(t, ctx, c, sopts...), got: make(chan *client.Leadership, 1)}
			cands[i] = cand
			go func() {
				l, err := cand.s.Campaign(ctx, name, []byte(fmt.Sprintf("v%d", i)))
				if err != nil {
					t.Errorf("candidate %d Campaign: %v", i, err)
				}
				cand.got <- l
			}()
			if i == 0 {
				// cand-0 leads before cand-1 campaigns: its Campaign
				// starts in a goroutine and goes through the proxy, so
				// cand-1's Acquire, sent right after its OpenSession,
				// could reach the server first (a stress run: cand-1
				// held the election and cand-0 waited behind it).
				if l0 = <-cand.got; l0 == nil {
					t.FailNow()
				}
				continue
			}
			testkit.Eventually(t, 10*time.Second, "candidate queued", func() error {
				info, err := srv.Client.Inspect(ctx, name)
				switch {
				case err != nil:
					return err
				case len(info.Waiters) != i || info.Waiters[i-1] != cand.s.ID():
					return fmt.Errorf("holder %s (%s), waiters %v; want cand-%d's %s last of %d", info.Session, info.Owner,
						info.Waiters, i, cand.s.ID(), i)
				}
				return nil
			})
		}
		obs.until("cand-0 leads with v0", leaderAny("cand-0"), leaderIs("cand-0", l0.Token(), "v0"))

		if err := l0.Proclaim(ctx, []byte("v0b")); err != nil {
			t.Fatalf("Proclaim: %v", err)
		}
		obs.until("cand-0 proclaims v0b, same token", func(client.Observation) bool { return false }, leaderIs("cand-0", l0.Token(), "v0b"))
		if !bytes.Equal(l0.Value(), []byte("v0b")) {
			t.Errorf("Value() = %q after Proclaim, want v0b", l0.Value())
		}

		// The leader falls silent: the server ends its session.
		cands[0].proxy.Pause()
		obs.until("no leader after cand-0 went silent", func(client.Observation) bool { return false }, noLeader)
		l1 := <-cands[1].got
		if l1 == nil {
			t.FailNow()
		}
		select {
		case <-l0.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the silent leader's Done did not close by the time the next leader was elected")
		}
		if err := l0.Proclaim(ctx, []byte("late")); !errors.Is(err, client.ErrLockLost) {
			t.Errorf("Proclaim by the deposed leader = %v; want ErrLockLost", err)
		}
		if l1.Token() <= l0.Token() {
			t.Errorf("cand-1 token %d, want > cand-0's %d", l1.Token(), l0.Token())
		}
		obs.until("cand-1 leads with v1", leaderAny("cand-1"), leaderIs("cand-1", l1.Token(), "v1"))
		select {
		case <-cands[2].got:
			t.Fatal("cand-2 elected while cand-1 leads")
		default:
		}

		// Resign hands over to the next in line.
		if err := l1.Resign(ctx); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		l2 := <-cands[2].got
		if l2 == nil {
			t.FailNow()
		}
		if l2.Token() <= l1.Token() {
			t.Errorf("cand-2 token %d, want > cand-1's %d", l2.Token(), l1.Token())
		}
		obs.until("cand-2 leads with v2", either(noLeader, leaderAny("cand-2")), leaderIs("cand-2", l2.Token(), "v2"))
		if err := l2.Resign(ctx); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		obs.until("no leader after the last resigned", func(client.Observation) bool { return false }, noLeader)
		t.Logf("observed %v", obs)
	})
}

// TestObserveResumes: Observe survives a broken connection: after the
// observer's connection is cut and restored, it reports what changed
// meanwhile (a new leader) and then follows live changes again. Its watch
// resumes from its cursor (C2 #ct2-watch-resume): on etcd the missed
// events are replayed; on PostgreSQL a resync makes Observe read the
// election again.
func TestObserveResumes(t *testing.T) {
	forBackends(t, observeResumes)
}

func observeResumes(t *testing.T, backend string) {
	srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
	ctx := testCtx(t, time.Minute)
	p := testkit.NewProxy(t, srv.Addr)
	oc, err := client.New(p.Addr(), client.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = oc.Close() })
	ch, err := oc.Observe(ctx, "elect/r")
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	obs := &observations{t: t, ch: ch}
	obs.until("no leader", func(client.Observation) bool { return false }, noLeader)

	p.Cut()
	s := newSession(t, ctx, srv.Client, client.WithOwner("a", nil))
	l, err := s.Campaign(ctx, "elect/r", []byte("x"))
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	p.Restore()
	obs.until("the leader elected while cut off", leaderAny("a"), leaderIs("a", l.Token(), "x"))
	if err := l.Proclaim(ctx, []byte("y")); err != nil {
		t.Fatalf("Proclaim: %v", err)
	}
	obs.until("the new value", func(client.Observation) bool { return false }, leaderIs("a", l.Token(), "y"))
}
