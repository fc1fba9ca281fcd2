package client

import (
	"context"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Bearer tokens (docs/contracts/C5.md #ct5-auth)
//
// WithBearerToken and WithBearerTokenFile send `authorization: Bearer
// <token>` with every call; the server maps the token's SHA-256 to a
// principal. A token travels only over transport security, except to a
// loopback target (the same rule as plaintext itself, tls.go): New refuses
// a token with WithInsecure to any other target. The token never appears
// in the SDK's logs or errors.

// tokenOptions are the bearer-token options.
type tokenOptions struct {
	token string
	file  string
	count int
}

// WithBearerToken sends token as a bearer token with every call. Prefer
// WithBearerTokenFile in programs whose arguments or environment others
// can read.
func WithBearerToken(token string) Option {
	return func(o *options) {
		o.token.token, o.token.file = token, ""
		o.token.count++
	}
}

// WithBearerTokenFile sends the token held in path (surrounding whitespace
// trimmed) as a bearer token with every call. New reads the file once and
// fails if it cannot be read or holds no token.
func WithBearerTokenFile(path string) Option {
	return func(o *options) {
		o.token.token, o.token.file = "", path
		o.token.count++
	}
}

// ReadTokenFile reads a bearer token file: its content with surrounding
// whitespace trimmed, never empty. Errors name the file, never its content.
func ReadTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%w: bearer token file: %w", ErrInvalidArgument, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("%w: bearer token file %s is empty", ErrInvalidArgument, path)
	}
	if strings.ContainsAny(tok, "\r\n") {
		return "", fmt.Errorf("%w: bearer token file %s holds more than one line", ErrInvalidArgument, path)
	}
	return tok, nil
}

// dialOption returns the per-RPC credentials of the token options (nil
// for none), checked against the connection's transport to target.
func (t tokenOptions) dialOption(target string, creds credentials.TransportCredentials) (grpc.DialOption, error) {
	if t.count == 0 {
		return nil, nil
	}
	if t.count > 1 {
		return nil, fmt.Errorf("%w: give one of WithBearerToken and WithBearerTokenFile", ErrInvalidArgument)
	}
	tok := t.token
	if t.file != "" {
		var err error
		if tok, err = ReadTokenFile(t.file); err != nil {
			return nil, err
		}
	}
	if tok == "" || strings.ContainsAny(tok, "\r\n") {
		return nil, fmt.Errorf("%w: bearer token is empty or holds a line break", ErrInvalidArgument)
	}
	secure := !loopbackTarget(target)
	if secure && creds.Info().SecurityProtocol == "insecure" {
		return nil, fmt.Errorf("%w: a bearer token is sent only over TLS to target %q, which is not a loopback address: "+
			"connect with WithTLS or WithTLSFiles", ErrInvalidArgument, target)
	}
	return grpc.WithPerRPCCredentials(bearer{header: "Bearer " + tok, secure: secure}), nil
}

// bearer is the per-RPC credentials of a bearer token.
type bearer struct {
	header string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": b.header}, nil
}

// RequireTransportSecurity is true unless the target is on loopback: gRPC
// then refuses to send the token over a plaintext connection.
func (b bearer) RequireTransportSecurity() bool { return b.secure }

// String keeps the token out of any %v of the credentials.
func (b bearer) String() string { return "bearer token (redacted)" }
