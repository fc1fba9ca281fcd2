package client

import (
	"context"
	"fmt"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// CheckOptions are CheckToken's options.
type CheckOptions struct {
	// Cached asks the server to answer from its watch-fed index of held
	// grants instead of reading the backend: cheaper, and at most one
	// watch delivery delay behind the backend (C2 #ct2-check-token).
	Cached bool
}

// TokenCheck is CheckToken's answer.
type TokenCheck struct {
	// Current is true when a grant of the key with the checked token is
	// held.
	Current bool
	// Tokens are the tokens of the key's current grants, lowest first;
	// empty when nobody holds the key.
	Tokens []uint64
	// Cached is true when the server's index answered, false when it read
	// the backend.
	Cached bool
}

// CheckToken asks whether (key, token) is a current grant of key:
// Chubby's CheckSequencer, for a resource handed a fencing token (C2
// #ct2-check-token). A key nobody holds is not current (no error). The
// caller needs read access to the key, as for Inspect.
func (c *Client) CheckToken(ctx context.Context, key string, token uint64, opts CheckOptions) (TokenCheck, error) {
	if err := validateKey(key); err != nil {
		return TokenCheck{}, fmt.Errorf("check token %q: %w", key, err)
	}
	if token == 0 {
		return TokenCheck{}, fmt.Errorf("check token %q: %w", key, invalidField("token", "0 is no grant's token"))
	}
	req := &lockdv1.CheckTokenRequest{Key: key, Token: token}
	if opts.Cached {
		req.Consistency = lockdv1.CheckConsistency_CHECK_CONSISTENCY_CACHED
	}
	var resp *lockdv1.CheckTokenResponse
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.api.CheckToken(ctx, req)
		return fromStatus(ctx, err)
	})
	if err != nil {
		return TokenCheck{}, fmt.Errorf("check token %q: %w", key, err)
	}
	return TokenCheck{Current: resp.GetCurrent(), Tokens: resp.GetTokens(), Cached: resp.GetCached()}, nil
}
