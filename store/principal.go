package store

import (
	"fmt"
	"unicode/utf8"
)

// MaxPrincipalLen is the longest principal name WithPrincipal accepts.
const MaxPrincipalLen = 1024

// WithPrincipal binds the session to name, the authenticated principal that
// opened it (C2 #ct2-ownership); SessionPrincipal reads it back. Empty: no
// principal (an anonymous opener).
func WithPrincipal(name string) SessionOption {
	return func(o *SessionOptions) { o.Principal = name }
}

// validatePrincipal checks a principal name given to WithPrincipal.
func validatePrincipal(name string) error {
	if len(name) > MaxPrincipalLen {
		return fmt.Errorf("%w: principal is %d bytes, at most %d", ErrInvalidArgument, len(name), MaxPrincipalLen)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("%w: principal is not valid UTF-8", ErrInvalidArgument)
	}
	return nil
}
