package storetest

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// Two independent instances on one namespace stand in for two lockd
// replicas over one backend (C2 #ct2-replicas): every live session is
// usable through either.

// openOwned opens a session on st with a secret hash and a principal and
// returns it with the hash.
func openOwned(t *testing.T, st store.LockStore, ttl time.Duration, principal string) (store.SessionID, []byte) {
	t.Helper()
	sum := sha256.Sum256([]byte(rand.Text()))
	sess, err := st.OpenSession(ctxT(t), ttl, store.WithSecretHash(sum[:]), store.WithPrincipal(principal))
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	return sess.ID, sum[:]
}

// testReplicaServesSession: a session opened on instance a is used through
// instance b alone — its owner record read, kept alive, locks taken,
// listed and released, and finally closed — and both instances agree.
func (s *suite) testReplicaServesSession(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	ctx := ctxT(t)
	id, hash := openOwned(t, a, LongTTL, "alice")
	ga := mustTry(t, a, id, "rep/a")

	// The owner record, as the server checks it before every call.
	if got, err := b.SessionSecretHash(ctx, id); err != nil || !bytes.Equal(got, hash) {
		t.Fatalf("SessionSecretHash via the other instance = %x, %v; want %x (a wrong secret could not be told from the right one)", got, err, hash)
	}
	if got, err := b.SessionPrincipal(ctx, id); err != nil || got != "alice" {
		t.Fatalf("SessionPrincipal via the other instance = %q, %v; want alice", got, err)
	}
	wrong := sha256.Sum256([]byte("not the secret"))
	if got, _ := b.SessionSecretHash(ctx, id); bytes.Equal(got, wrong[:]) {
		t.Fatal("SessionSecretHash via the other instance matches a wrong secret's hash")
	}

	// Liveness and the deadline bound, through b.
	if l := heartbeat(t, b, id); !l.Live || l.Remaining <= 0 || l.Remaining > LongTTL {
		t.Fatalf("Heartbeat via the other instance = %+v; want live with Remaining in (0, %v]", l, LongTTL)
	}
	// Grants through b, of the same session; the held set from either
	// instance lists both grants.
	gb := mustTry(t, b, id, "rep/b")
	if gb.Remaining <= 0 || gb.Remaining > LongTTL {
		t.Fatalf("TryInsert via the other instance: Remaining %v; want in (0, %v]", gb.Remaining, LongTTL)
	}
	for name, st := range map[string]store.LockStore{"opener": a, "other": b} {
		gs, err := st.LocksOf(ctx, id)
		if err != nil || len(gs) != 2 || gs[0].Key != ga.Key || gs[0].Token != ga.Token || gs[1].Key != gb.Key || gs[1].Token != gb.Token {
			t.Fatalf("LocksOf via the %s instance = %+v, %v; want [%s@%d %s@%d]", name, gs, err, ga.Key, ga.Token, gb.Key, gb.Token)
		}
	}
	// A grant made through a is released through b, and the other way.
	mustRelease(t, b, ga)
	mustRelease(t, a, gb)
	for _, k := range []string{ga.Key, gb.Key} {
		if info, found := inspect(t, a, k); found {
			t.Fatalf("%q after its release = %+v; want free", k, info)
		}
	}
	// A waiter of another session, queued through a, is handed the key
	// when b releases it.
	g2 := mustTry(t, b, id, "rep/q")
	other := openSession(t, a)
	ch := startAcquire(t, ctx, a, other, g2.Key)
	waitersAre(t, b, g2.Key, []store.SessionID{other})
	mustRelease(t, b, g2)
	if r := recvResult(t, ch, 10*time.Second, "waiter after a release through the other instance"); r.err != nil || r.g.Token <= g2.Token {
		t.Fatalf("waiter Acquire = %+v, %v; want a grant with token > %d", r.g, r.err, g2.Token)
	}

	// Closed through b: dead everywhere, its lock freed.
	g3 := mustTry(t, a, id, "rep/c")
	n, err := b.CloseSession(ctx, id)
	if err != nil || n != 1 {
		t.Fatalf("CloseSession via the other instance = %d, %v; want 1 (the lock taken through the opener), nil", n, err)
	}
	testkit.Eventually(t, s.expiryBound(), "the session closed through the other instance is dead on the opener", func() error {
		if l := heartbeat(t, a, id); l.Live {
			return fmt.Errorf("opener reports it live")
		}
		return nil
	})
	if l := heartbeat(t, b, id); l.Live {
		t.Fatalf("Heartbeat via the closing instance after CloseSession = %+v; want not live", l)
	}
	if _, found := inspect(t, a, g3.Key); found {
		t.Fatalf("%q still held after its session was closed through the other instance", g3.Key)
	}
	if _, _, err := a.TryInsert(ctx, id, "rep/after"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("TryInsert on the opener after the close = %v; want ErrSessionDead", err)
	}
	if _, err := b.SessionSecretHash(ctx, id); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("SessionSecretHash after the close = %v; want ErrSessionDead", err)
	}
}

// testReplicaOutlivesOpener: the instance that opened a session stops
// (Close, as at a lockd shutdown or crash) while another instance serves
// the session: the session and its lock stay for as long as the other
// instance keeps it (well past the TTL), the other instance's Remaining
// stays a bound it can prove, and ExpireSession through the other
// instance then ends nothing while it still keeps the session.
func (s *suite) testReplicaOutlivesOpener(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	id, _ := openOwned(t, a, TTL, "")
	g := mustTry(t, a, id, "out/k")
	if l := heartbeat(t, b, id); !l.Live {
		t.Fatalf("Heartbeat via the other instance = %+v; want live", l)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close the opener: %v", err)
	}
	closed := time.Now()
	tick := time.NewTicker(TTL / 5)
	defer tick.Stop()
	for time.Since(closed) < 3*TTL {
		l := heartbeat(t, b, id)
		if !l.Live || l.Remaining > TTL+time.Second {
			t.Fatalf("Heartbeat via the other instance %v after the opener closed = %+v; want live, Remaining at most the TTL", time.Since(closed), l)
		}
		if info, found := inspect(t, b, g.Key); !found || info.Session != id || info.Token != g.Token {
			t.Fatalf("%q %v after the opener closed = %+v (found %v); want held by %s, token %d", g.Key, time.Since(closed), info, found, id, g.Token)
		}
		<-tick.C
	}
	gs, err := b.LocksOf(ctxT(t), id)
	if err != nil || len(gs) != 1 || gs[0].Token != g.Token {
		t.Fatalf("LocksOf via the other instance = %+v, %v; want the one grant, token %d", gs, err, g.Token)
	}
	mustRelease(t, b, g)
	if n, err := b.CloseSession(ctxT(t), id); err != nil || n != 0 {
		t.Fatalf("CloseSession via the other instance = %d, %v; want 0, nil", n, err)
	}
}

// testReplicaUnknownSession: an id no instance opened is dead through
// every instance and adopting it writes nothing.
func (s *suite) testReplicaUnknownSession(t *testing.T) {
	insts := s.instances(t, 2)
	b := insts[1]
	ctx := ctxT(t)
	id := store.NewSessionID()
	if l := heartbeat(t, b, id); l.Live {
		t.Fatalf("Heartbeat(unknown) = %+v; want not live", l)
	}
	if _, err := b.SessionSecretHash(ctx, id); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("SessionSecretHash(unknown) = %v; want ErrSessionDead", err)
	}
	if _, err := b.ExpireSession(ctx, id); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("ExpireSession(unknown) = %v; want ErrSessionDead", err)
	}
	if n, err := b.CloseSession(ctx, id); err != nil || n != 0 {
		t.Fatalf("CloseSession(unknown) = %d, %v; want 0, nil", n, err)
	}
	if _, _, err := b.TryInsert(ctx, id, "unk/rep"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("TryInsert(unknown) = %v; want ErrSessionDead", err)
	}
	if _, found := inspect(t, insts[0], "unk/rep"); found {
		t.Fatal("unk/rep held after a TryInsert by an unknown session")
	}
}
