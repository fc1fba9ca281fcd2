package storetest

import (
	"errors"
	"strings"
	"testing"

	"lock.dev/lockd/store"
)

// testSessionPrincipal checks C2 #ct2-ownership: the principal given at
// open is the one read back (with the secret hash beside it), a session
// opened without one has "", unknown and closed sessions are
// ErrSessionDead, and an over-long or non-UTF-8 name is refused.
func (s *suite) testSessionPrincipal(t *testing.T) {
	sts := s.instances(t, 2)
	st, other := sts[0], sts[1]
	ctx := ctxT(t)

	const name = "spiffe://example.org/ns/prod/sa/billing"
	sess, err := st.OpenSession(ctx, LongTTL, store.WithPrincipal(name), store.WithSecretHash(make([]byte, store.SecretHashSize)))
	if err != nil {
		t.Fatalf("OpenSession(WithPrincipal): %v", err)
	}
	if got, err := st.SessionPrincipal(ctx, sess.ID); err != nil || got != name {
		t.Fatalf("SessionPrincipal = %q, %v; want %q, nil", got, err, name)
	}
	if got, err := st.SessionSecretHash(ctx, sess.ID); err != nil || len(got) != store.SecretHashSize {
		t.Fatalf("SessionSecretHash beside a principal = %x, %v; want the hash", got, err)
	}
	// Another instance reads the same record (C2 #ct2-replicas).
	if got, err := other.SessionPrincipal(ctx, sess.ID); err != nil || got != name {
		t.Fatalf("SessionPrincipal from another instance = %q, %v; want %q", got, err, name)
	}

	plain := openSession(t, st)
	if got, err := st.SessionPrincipal(ctx, plain); err != nil || got != "" {
		t.Fatalf("SessionPrincipal(opened without one) = %q, %v; want \"\", nil", got, err)
	}
	if got, err := st.SessionPrincipal(ctx, store.NewSessionID()); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("SessionPrincipal(unknown) = %q, %v; want ErrSessionDead", got, err)
	}
	if _, err := st.SessionPrincipal(ctx, "bad\x00id"); !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("SessionPrincipal(bad id) = %v; want ErrInvalidArgument", err)
	}
	for _, bad := range []string{strings.Repeat("p", store.MaxPrincipalLen+1), "bad\xff"} {
		if _, err := st.OpenSession(ctx, LongTTL, store.WithPrincipal(bad)); !errors.Is(err, store.ErrInvalidArgument) {
			t.Fatalf("OpenSession(WithPrincipal(%.20q…)) = %v; want ErrInvalidArgument", bad, err)
		}
	}

	if _, err := st.CloseSession(ctx, sess.ID); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	if got, err := st.SessionPrincipal(ctx, sess.ID); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("SessionPrincipal after close = %q, %v; want ErrSessionDead", got, err)
	}
}
