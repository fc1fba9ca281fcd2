package server_test

import (
	"bytes"
	"maps"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// TestHolderIdentity is issue #15 §1 on the wire (C2 #ct2-holder): the
// owner and labels of OpenSession and the value of Acquire come back from
// Inspect and List; out-of-bounds ones are INVALID_ARGUMENT naming the field.
func TestHolderIdentity(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testCtx(t, time.Minute)
		api := dial(t, srv.Addr)

		labels := map[string]string{"job": "deploy/api"}
		sess, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: longTTL.Milliseconds(), Owner: "web-3 (pid 812)", Labels: labels})
		if err != nil {
			t.Fatalf("OpenSession(owner, labels): %v", err)
		}
		acq, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sess.SessionId, Key: "holder/a", Value: []byte("v1")})
		if err != nil || !acq.Granted {
			t.Fatalf("Acquire(value) = %v, %v; want granted", acq, err)
		}
		in, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: "holder/a"})
		if err != nil || !in.Held {
			t.Fatalf("Inspect = %v, %v", in, err)
		}
		check := func(what string, l *lockdv1.LockInfo) {
			t.Helper()
			if l.Owner != "web-3 (pid 812)" || !maps.Equal(l.Labels, labels) || !bytes.Equal(l.Value, []byte("v1")) || l.Token != acq.Token {
				t.Fatalf("%s = owner %q labels %v value %q token %d; want web-3 (pid 812), %v, v1, %d", what, l.Owner, l.Labels, l.Value, l.Token, labels, acq.Token)
			}
		}
		check("Inspect", in.Lock)
		ls, err := api.List(ctx, &lockdv1.ListRequest{Prefix: "holder/"})
		if err != nil || len(ls.Locks) != 1 {
			t.Fatalf("List = %v, %v; want one lock", ls, err)
		}
		check("List", ls.Locks[0])

		for _, tc := range []struct {
			field string
			call  func() error
		}{
			{"owner", func() error {
				_, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{Owner: strings.Repeat("o", 129)})
				return err
			}},
			{"owner", func() error {
				_, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{Owner: "evil\x1b]0;x\x07"})
				return err
			}},
			{"labels", func() error {
				_, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{Labels: map[string]string{"k": strings.Repeat("v", 65)}})
				return err
			}},
			{"value", func() error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sess.SessionId, Key: "holder/b", Value: make([]byte, 4097)})
				return err
			}},
		} {
			err := tc.call()
			if v, ok := wireerr.FieldViolation(status.Convert(err)); status.Code(err) != codes.InvalidArgument || !ok || v.Field != tc.field {
				t.Errorf("bad %s: %v; want INVALID_ARGUMENT on field %s", tc.field, err, tc.field)
			}
		}
	})
}
