package storetest

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"testing"

	"lock.dev/lockd/store"
)

// testSessionSecretHash checks C2 #ct2-ownership: the hash given at open is
// the one read back (a copy: the caller's slice may change afterwards),
// unknown and closed sessions are ErrSessionDead, a session opened without
// one has none, and a hash of the wrong size is refused.
func (s *suite) testSessionSecretHash(t *testing.T) {
	sts := s.instances(t, 2)
	st, other := sts[0], sts[1]
	ctx := ctxT(t)

	sum := sha256.Sum256([]byte(rand.Text()))
	h := sum[:]
	want := bytes.Clone(h)
	sess, err := st.OpenSession(ctx, LongTTL, store.WithSecretHash(h))
	if err != nil {
		t.Fatalf("OpenSession(WithSecretHash): %v", err)
	}
	h[0] ^= 0xff // the store keeps its own copy
	if got, err := st.SessionSecretHash(ctx, sess.ID); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("SessionSecretHash = %x, %v; want %x, nil", got, err, want)
	}
	// Another instance reads the same record (C2 #ct2-replicas).
	if got, err := other.SessionSecretHash(ctx, sess.ID); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("SessionSecretHash from another instance = %x, %v; want %x", got, err, want)
	}

	plain := openSession(t, st)
	if got, err := st.SessionSecretHash(ctx, plain); err != nil || got != nil {
		t.Fatalf("SessionSecretHash(opened without a hash) = %x, %v; want nil, nil", got, err)
	}
	if got, err := st.SessionSecretHash(ctx, store.NewSessionID()); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("SessionSecretHash(unknown) = %x, %v; want ErrSessionDead", got, err)
	}
	if _, err := st.SessionSecretHash(ctx, "bad\x00id"); !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("SessionSecretHash(bad id) = %v; want ErrInvalidArgument", err)
	}
	if _, err := st.OpenSession(ctx, LongTTL, store.WithSecretHash(want[:31])); !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("OpenSession(31-byte hash) = %v; want ErrInvalidArgument", err)
	}

	if _, err := st.CloseSession(ctx, sess.ID); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	if got, err := st.SessionSecretHash(ctx, sess.ID); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("SessionSecretHash after close = %x, %v; want ErrSessionDead", got, err)
	}
}
