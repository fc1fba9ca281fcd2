package client_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/testing/lockdtest"
)

// tokenPolicy gives alice lock and read on every key, nobody else anything.
const tokenPolicy = `
rules:
  - name: alice
    principals: [alice]
    prefixes: ["*"]
    allow: [read, lock]
`

// writeFile writes content to name in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBearerToken: against a server with a tokens file and a policy, the
// SDK with alice's token (given directly or from a file) opens a session
// and takes a lock; without a token, or with an unknown one, it is refused
// with ErrPermissionDenied, and the error never shows the token.
func TestBearerToken(t *testing.T) {
	const token, unknown = "s3cr3t-token-of-alice-0123456789", "not-a-known-token-9876543210"
	dir := t.TempDir()
	az, err := auth.New(auth.Config{
		PolicyFile: writeFile(t, dir, "policy.yaml", tokenPolicy),
		TokensFile: writeFile(t, dir, "tokens", auth.HashToken(token)+" alice\n"),
	}, auth.Options{})
	if err != nil {
		t.Fatalf("auth.New: %v", err)
	}
	t.Cleanup(func() { _ = az.Close() })
	tokenFile := writeFile(t, dir, "token", "\n  "+token+"\n")
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{Auth: az, NoClient: true})
	ctx := testCtx(t, time.Minute)

	for name, opt := range map[string]client.Option{
		"WithBearerToken":     client.WithBearerToken(token),
		"WithBearerTokenFile": client.WithBearerTokenFile(tokenFile),
	} {
		c, err := client.New(srv.Addr, opt)
		if err != nil {
			t.Fatalf("client.New(%s): %v", name, err)
		}
		sess, err := c.NewSession(ctx)
		if err != nil {
			t.Fatalf("%s: NewSession: %v", name, err)
		}
		l, err := sess.Acquire(ctx, "tok/"+name)
		if err != nil {
			t.Fatalf("%s: Acquire: %v", name, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("%s: Release: %v", name, err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("%s: Close: %v", name, err)
		}
	}

	for name, opts := range map[string][]client.Option{
		"no token":      nil,
		"unknown token": {client.WithBearerToken(unknown)},
	} {
		c, err := client.New(srv.Addr, opts...)
		if err != nil {
			t.Fatalf("client.New(%s): %v", name, err)
		}
		_, err = c.NewSession(ctx)
		if !errors.Is(err, client.ErrPermissionDenied) {
			t.Errorf("%s: NewSession = %v; want ErrPermissionDenied", name, err)
		}
		if err != nil && strings.Contains(err.Error(), unknown) {
			t.Errorf("%s: the error shows the token: %v", name, err)
		}
		_, err = c.Inspect(ctx, "tok/x")
		if !errors.Is(err, client.ErrPermissionDenied) {
			t.Errorf("%s: Inspect = %v; want ErrPermissionDenied", name, err)
		}
		// An unknown token is unauthenticated (401 over HTTP), not a
		// denial by the rules (issue 23); no token is anonymous, denied.
		if unauth := errors.Is(err, client.ErrUnauthenticated); unauth != (name == "unknown token") ||
			unauth != strings.Contains(fmt.Sprint(err), "unauthenticated") {
			t.Errorf("%s: Inspect = %v; ErrUnauthenticated %v, want %v and said so", name, err, unauth, name == "unknown token")
		}
		_ = c.Close()
	}
}

// TestBearerTokenOptions: a token goes only over TLS to a remote target;
// bad token files are refused at New, naming the file, never the token.
func TestBearerTokenOptions(t *testing.T) {
	const token = "tok-abcdefghijklmnop"
	if _, err := client.New("10.1.2.3:7420", client.WithInsecure(), client.WithBearerToken(token)); !errors.Is(err, client.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "TLS") || strings.Contains(err.Error(), token) {
		t.Errorf("client.New(remote, WithInsecure, WithBearerToken) = %v; want ErrInvalidArgument asking for TLS, without the token", err)
	}
	for name, opts := range map[string][]client.Option{
		"remote over TLS": {client.WithTLS(nil), client.WithBearerToken(token)},
	} {
		c, err := client.New("10.1.2.3:7420", opts...)
		if err != nil {
			t.Errorf("client.New(%s) = %v; want success", name, err)
			continue
		}
		_ = c.Close()
	}
	if c, err := client.New("127.0.0.1:7420", client.WithBearerToken(token)); err != nil {
		t.Errorf("client.New(loopback, plaintext, token) = %v; want success", err)
	} else {
		_ = c.Close()
	}
	dir := t.TempDir()
	for name, path := range map[string]string{
		"missing":    filepath.Join(dir, "nope"),
		"empty":      writeFile(t, dir, "empty", " \n"),
		"two tokens": writeFile(t, dir, "two", token+"\n"+token+"\n"),
	} {
		_, err := client.New("127.0.0.1:7420", client.WithBearerTokenFile(path))
		if !errors.Is(err, client.ErrInvalidArgument) || strings.Contains(err.Error(), token) {
			t.Errorf("client.New(token file %s) = %v; want ErrInvalidArgument without the token", name, err)
		}
	}
	if _, err := client.New("127.0.0.1:7420", client.WithBearerToken(token), client.WithBearerToken(token)); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("client.New with two token options = %v; want ErrInvalidArgument", err)
	}
}
