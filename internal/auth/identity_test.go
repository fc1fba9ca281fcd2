package auth

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"lock.dev/lockd/internal/testing/testkit"
)

// TestIdentify runs a real gRPC server with mTLS (client-auth request, so
// certificate-less callers get through too) whose interceptor records
// Identify's answer, and calls it with each kind of credential.
func TestIdentify(t *testing.T) {
	ca := testkit.NewCA(t, "test CA")
	dir := t.TempDir()
	pf, tf := filepath.Join(dir, "policy"), filepath.Join(dir, "tokens")
	if err := os.WriteFile(pf, []byte("rules: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tf, []byte(HashToken("tok-alice")+" alice\n"+HashToken("tok-spiffe")+" spiffe://example.org/ns/prod/sa/billing\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	az, err := New(Config{PolicyFile: pf, TokensFile: tf}, Options{ReloadInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer az.Close()

	type result struct {
		principal string
		err       error
	}
	got := make(chan result, 1)
	srvCert := ca.Issue(t, testkit.CertOptions{CommonName: "lockd", IPs: []net.IP{net.ParseIP("127.0.0.1")}}).TLS(t)
	gs := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{srvCert}, ClientCAs: ca.Pool(),
			ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS13})),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			p, err := az.Identify(ctx)
			got <- result{p, err}
			return h(ctx, req)
		}))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }() // exits at Stop below
	defer func() { gs.Stop(); <-served }()

	call := func(cert *tls.Certificate, token string) result {
		t.Helper()
		cfg := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS13}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, AuthorizationHeader, "Bearer "+token)
		}
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("Check: %v", err)
		}
		return <-got
	}

	spiffe := ca.Issue(t, testkit.CertOptions{CommonName: "billing", URIs: []*url.URL{{Scheme: "spiffe", Host: "example.org", Path: "/ns/prod/sa/billing"}}}).TLS(t)
	cnOnly := ca.Issue(t, testkit.CertOptions{CommonName: "alice"}).TLS(t)
	// Same name as the real CA: Go's TLS client sends a certificate only to a
	// server that names its issuer, and the test wants it sent (and refused).
	stranger := testkit.NewCA(t, "test CA").Issue(t, testkit.CertOptions{CommonName: "mallory"}).TLS(t)
	for _, c := range []struct {
		name   string
		cert   *tls.Certificate
		token  string
		want   string
		authnd bool // refused credentials
	}{
		{"URI SAN", &spiffe, "", "spiffe://example.org/ns/prod/sa/billing", false},
		{"CN", &cnOnly, "", "alice", false},
		{"nothing", nil, "", Anonymous, false},
		{"token", nil, "tok-alice", "alice", false},
		{"unknown token", nil, "tok-bob", Anonymous, true},
		{"the hash as token", nil, HashToken("tok-alice"), Anonymous, true},
		{"certificate and matching token", &spiffe, "tok-spiffe", "spiffe://example.org/ns/prod/sa/billing", false},
		{"certificate and another's token", &spiffe, "tok-alice", "spiffe://example.org/ns/prod/sa/billing", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := call(c.cert, c.token)
			if r.principal != c.want || errors.Is(r.err, ErrUnauthenticated) != c.authnd {
				t.Errorf("Identify = %q, %v; want %q (refused: %v)", r.principal, r.err, c.want, c.authnd)
			}
		})
	}

	// A certificate from another CA fails the handshake: never a principal.
	cfg := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{stranger}, MinVersion: tls.VersionTLS13}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Errorf("a certificate of another CA was accepted (principal %q)", (<-got).principal)
	}

	// A plaintext call has no certificate: Anonymous (PeerCertificate nil).
	if p := PeerCertificate(context.Background()); p != nil {
		t.Errorf("PeerCertificate without a peer = %v", p)
	}
}
