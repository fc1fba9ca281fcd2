package store

import "fmt"

// SecretHashSize is the size of a session secret hash (SHA-256), the only
// size WithSecretHash accepts (C2 #ct2-ownership).
const SecretHashSize = 32

// SessionOption configures OpenSession.
type SessionOption func(*SessionOptions)

// SessionOptions are what OpenSession's options set. Backends read them with
// NewSessionOptions.
type SessionOptions struct {
	// SecretHash is the hash of the owner's session secret, persisted with
	// the session (never the secret itself); nil for none.
	SecretHash []byte
	// Owner and Labels describe who holds the session's locks (WithOwner,
	// C2 #ct2-holder); empty for none.
	Owner  string
	Labels map[string]string
	// Principal is the authenticated principal the session is bound to
	// (principal.go); "" for none.
	Principal string
}

// WithSecretHash records h, the SHA-256 of the session's secret, with the
// session (C2 #ct2-ownership). OpenSession copies it.
func WithSecretHash(h []byte) SessionOption {
	return func(o *SessionOptions) { o.SecretHash = append([]byte(nil), h...) }
}

// NewSessionOptions applies opts and validates the result: a secret hash
// that is set must be SecretHashSize bytes, and the owner and labels must
// pass ValidateOwner and ValidateLabels (ErrInvalidArgument otherwise).
func NewSessionOptions(opts ...SessionOption) (SessionOptions, error) {
	var o SessionOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.SecretHash != nil && len(o.SecretHash) != SecretHashSize {
		return SessionOptions{}, fmt.Errorf("%w: secret hash is %d bytes, want %d", ErrInvalidArgument, len(o.SecretHash), SecretHashSize)
	}
	if err := ValidateOwner(o.Owner); err != nil {
		return SessionOptions{}, err
	}
	if err := validatePrincipal(o.Principal); err != nil {
		return SessionOptions{}, err
	}
	if err := ValidateLabels(o.Labels); err != nil {
		return SessionOptions{}, err
	}
	return o, nil
}
