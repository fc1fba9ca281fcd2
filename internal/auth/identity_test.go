package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
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
)

// testCA issues certificates for the identity tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

var serial int64 = 10

func (ca *testCA) issue(t *testing.T, cn string, uris []string, ips []net.IP, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestIdentify runs a real gRPC server with mTLS (client-auth request, so
// certificate-less callers get through too) whose interceptor records
// Identify's answer, and calls it with each kind of credential.
func TestIdentify(t *testing.T) {
	ca := newCA(t)
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
	srvCert := ca.issue(t, "lockd", nil, []net.IP{net.ParseIP("127.0.0.1")}, x509.ExtKeyUsageServerAuth)
	gs := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{srvCert}, ClientCAs: ca.pool,
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
		cfg := &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS13}
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

	spiffe := ca.issue(t, "billing", []string{"spiffe://example.org/ns/prod/sa/billing"}, nil, x509.ExtKeyUsageClientAuth)
	cnOnly := ca.issue(t, "alice", nil, nil, x509.ExtKeyUsageClientAuth)
	stranger := newCA(t).issue(t, "mallory", nil, nil, x509.ExtKeyUsageClientAuth)
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
	cfg := &tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{stranger}, MinVersion: tls.VersionTLS13}
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
