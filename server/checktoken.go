package server

import (
	"context"
	"fmt"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// CheckToken implements the CheckToken RPC (C2 #ct2-check-token): whether
// (key, token) is a current grant of the key, read through the backend
// (linearizable) or from the server's watch-fed index (cached,
// tokenindex.go). Authorised like Inspect (auth.go checkOf).
func (s service) CheckToken(ctx context.Context, req *lockdv1.CheckTokenRequest) (*lockdv1.CheckTokenResponse, error) {
	if err := store.ValidateKey(req.Key); err != nil {
		return nil, s.toStatus(ctx, "CheckToken", invalid("key", err))
	}
	if req.Token == 0 {
		return nil, s.toStatus(ctx, "CheckToken", invalidf("token", "0 is no grant's token"))
	}
	var ticket readTicket
	switch req.Consistency {
	case lockdv1.CheckConsistency_CHECK_CONSISTENCY_UNSPECIFIED, lockdv1.CheckConsistency_CHECK_CONSISTENCY_LINEARIZABLE:
	case lockdv1.CheckConsistency_CHECK_CONSISTENCY_CACHED:
		tokens, t, ok := s.tokens.lookup(req.Key)
		if ok {
			return checkAnswer(req.Token, tokens, true), nil
		}
		ticket = t
	default:
		return nil, s.toStatus(ctx, "CheckToken", invalidf("consistency", "unknown value %d", int32(req.Consistency)))
	}
	info, found, err := s.st.Inspect(ctx, req.Key)
	if err != nil {
		return nil, s.toStatus(ctx, "CheckToken", fmt.Errorf("check token: %w", err))
	}
	var tokens []uint64
	if found {
		tokens = grantTokens(info)
	}
	s.tokens.fill(req.Key, ticket, tokens)
	return checkAnswer(req.Token, tokens, false), nil
}

// grantTokens lists a held key's grants' tokens.
func grantTokens(info store.LockInfo) []uint64 {
	if len(info.Holders) == 0 {
		return []uint64{info.Token}
	}
	out := make([]uint64, 0, len(info.Holders))
	for _, h := range info.Holders {
		out = append(out, h.Token)
	}
	return out
}

func checkAnswer(token uint64, tokens []uint64, cached bool) *lockdv1.CheckTokenResponse {
	resp := &lockdv1.CheckTokenResponse{Tokens: tokens, Cached: cached}
	for _, t := range tokens {
		if t == token {
			resp.Current = true
		}
	}
	return resp
}
