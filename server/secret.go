package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/store"
)

// Session ownership (docs/contracts/C2.md #ct2-ownership): OpenSession hands
// the opener a random secret and keeps only its SHA-256, in the session's
// record here and in the store (so another replica can check it). Every
// call that acts for a session (Acquire, Release, KeepAlive, CloseSession)
// must carry the secret; checkSecret compares in constant time and refuses
// before anything changes. A session opened by an authenticated principal
// is also bound to it (principal.go).

// secretSize is the size of a session secret: 256 random bits.
const secretSize = 32

// newSessionSecret draws a session secret from crypto/rand and returns it
// with its hash. The secret goes to the opener only, never to a log.
func newSessionSecret() (secret, hash []byte) {
	secret = make([]byte, secretSize)
	_, _ = rand.Read(secret) // never fails (crypto/rand since Go 1.24)
	sum := sha256.Sum256(secret)
	return secret, sum[:]
}

// deniedError is a refused call: it crosses the wire as PERMISSION_DENIED
// with reason (a wireerr reason); label is the C4 reason.
type deniedError struct {
	reason, label, msg string
	limit              string // set for a refusal answered LIMIT (refusals.go)
}

func (e *deniedError) Error() string { return e.msg }

var (
	errSecretRequired = &deniedError{reason: wireerr.ReasonSessionSecretRequired, label: telemetry.DeniedSecretRequired,
		msg: "session secret required: the client sent none (an SDK from before session secrets?); upgrade the lockd SDK"}
	errSecretMismatch = &deniedError{reason: wireerr.ReasonSessionSecretMismatch, label: telemetry.DeniedSecretMismatch,
		msg: "session secret does not match the session"}
)

// checkSecret checks that secret is the secret of session id before method
// acts for it, then (principal.go) that the caller is the principal the
// session is bound to. nil means go on: the secret matches, or the store does not
// know the session (nothing can be done to it, and the call then finds it
// dead as before). A refusal is errSecretRequired or errSecretMismatch,
// logged (auth_denied, with the public id only) and counted; any other
// error is the store's (retryable, or the caller's context).
func (s *Server) checkSecret(ctx context.Context, method string, id store.SessionID, secret []byte) error {
	h, err := s.secretHash(ctx, id)
	switch {
	case errors.Is(err, store.ErrSessionDead):
		return nil
	case err != nil:
		return err
	}
	denied := errSecretMismatch
	if len(secret) == 0 {
		denied = errSecretRequired
	} else {
		sum := sha256.Sum256(secret)
		// A session without a hash (opened by a lockd from before session
		// secrets) matches nothing: fail closed.
		if len(h) == sha256.Size && subtle.ConstantTimeCompare(sum[:], h) == 1 {
			return s.checkPrincipal(ctx, method, id) // principal.go
		}
	}
	return s.refuseSession(ctx, method, denied, id)
}

// refuseSession logs and counts a refusal for a session's ownership and
// returns it; past the peer's refusal rate (refusals.go) it only counts it
// and answers LIMIT refusals.
func (s *Server) refuseSession(ctx context.Context, method string, denied *deniedError, id store.SessionID) error {
	if s.overRefusals(ctx, callerPrincipal(ctx)) {
		return errRefusalsExceeded
	}
	s.tlog.AuthDenied(method, denied.label, id)
	s.metrics.AuthDenied(method, denied.label)
	return denied
}

var errRefusalsExceeded = &deniedError{reason: wireerr.ReasonLimit, limit: wireerr.LimitRefusals, msg: errRefusalLimit}

// secretHash returns the hash of session id's secret: from the server's
// record when it has it (sessions opened here, or checked before), else
// from the store (a session adopted from another replica or an earlier
// run), remembered in the record if there is one. A session's hash never
// changes, so the copy cannot go stale.
func (s *Server) secretHash(ctx context.Context, id store.SessionID) ([]byte, error) {
	if h := s.sess.SecretHash(id); h != nil {
		return h, nil
	}
	h, err := s.st.SessionSecretHash(ctx, id)
	if err != nil || h == nil {
		return h, err
	}
	s.sess.SetSecretHash(id, h)
	return h, nil
}
