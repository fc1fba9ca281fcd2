package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/server"
	"lock.dev/lockd/store"
)

// tlsEnv is a server with TLS from files in a temp dir and the CAs and
// certificates a test needs.
type tlsEnv struct {
	dir      string
	serverCA *testkit.CA // signs the server's certificate
	clientCA *testkit.CA // the server's client CA
	srv      *lockdtest.Server
	logs     *testkit.LogBuffer
}

// startTLS starts a server with TLS; clientAuth "" means no client CA.
func startTLS(t *testing.T, clientAuth string) *tlsEnv {
	t.Helper()
	e := &tlsEnv{dir: t.TempDir(), serverCA: testkit.NewCA(t, "server-ca"), clientCA: testkit.NewCA(t, "client-ca")}
	cfg := lockdtest.Config()
	cfg.TLSCertFile, cfg.TLSKeyFile = e.serverCA.Issue(t, testkit.CertOptions{}).Write(t, e.dir, "server")
	if clientAuth != "" {
		cfg.TLSClientCAFile = e.clientCA.WriteCA(t, e.dir, "client-ca.pem")
		cfg.TLSClientAuth = clientAuth
	}
	logger, logs := testkit.NewLogger()
	e.logs = logs
	e.srv = lockdtest.StartBackend(t, backend.Etcd, lockdtest.Options{Config: &cfg, NoClient: true, Logger: logger})
	return e
}

// clientTLS is a client config trusting roots, presenting cert if given;
// handshakes counts the connection's TLS handshakes.
func clientTLS(t *testing.T, roots *testkit.CA, cert *testkit.Cert, handshakes *atomic.Int32) *tls.Config {
	t.Helper()
	cfg := &tls.Config{RootCAs: roots.Pool(), MinVersion: tls.VersionTLS12}
	if cert != nil {
		// Sent whatever CAs the server names (Certificates would be
		// filtered by them, and a stranger's certificate never sent).
		c := cert.TLS(t)
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
	}
	if handshakes != nil {
		cfg.VerifyConnection = func(tls.ConnectionState) error { handshakes.Add(1); return nil }
	}
	return cfg
}

// check makes one health call over a new connection with creds and
// returns its error.
func healthCheck(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func TestTLSRefusesPlaintextClient(t *testing.T) {
	e := startTLS(t, "")
	if err := healthCheck(t, e.srv.Addr, insecure.NewCredentials()); err == nil {
		t.Fatal("plaintext health check against a TLS server succeeded")
	}
	if err := healthCheck(t, e.srv.Addr, credentials.NewTLS(clientTLS(t, e.serverCA, nil, nil))); err != nil {
		t.Fatalf("TLS health check: %v", err)
	}
	// The SDK over TLS: a session and a lock.
	c := e.srv.NewClient(t, client.WithTLS(clientTLS(t, e.serverCA, nil, nil)))
	ctx := testkit.Context(t, 10*time.Second)
	s, err := c.NewSession(ctx, client.WithSessionTTL(longTTL))
	if err != nil {
		t.Fatalf("NewSession over TLS: %v", err)
	}
	if _, err := s.Acquire(ctx, "tls/a"); err != nil {
		t.Fatalf("Acquire over TLS: %v", err)
	}
}

func TestMTLSRefusesWrongCAAndExpiredCertificates(t *testing.T) {
	e := startTLS(t, server.ClientAuthRequire)
	good := e.clientCA.Issue(t, testkit.CertOptions{CommonName: "alice"})
	stranger := testkit.NewCA(t, "stranger-ca").Issue(t, testkit.CertOptions{CommonName: "mallory"})
	expired := e.clientCA.Issue(t, testkit.CertOptions{CommonName: "old",
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	tests := []struct {
		name string
		cert *testkit.Cert
		ok   bool
	}{
		{"client CA certificate", &good, true},
		{"no certificate", nil, false},
		{"certificate from another CA", &stranger, false},
		{"expired certificate", &expired, false},
	}
	for _, tt := range tests {
		err := healthCheck(t, e.srv.Addr, credentials.NewTLS(clientTLS(t, e.serverCA, tt.cert, nil)))
		if (err == nil) != tt.ok {
			t.Errorf("%s: health check error = %v, want success %v", tt.name, err, tt.ok)
		}
	}
}

func TestMTLSRequestAcceptsNoCertificate(t *testing.T) {
	e := startTLS(t, server.ClientAuthRequest)
	if err := healthCheck(t, e.srv.Addr, credentials.NewTLS(clientTLS(t, e.serverCA, nil, nil))); err != nil {
		t.Errorf("request mode without a client certificate: %v", err)
	}
	stranger := testkit.NewCA(t, "stranger-ca").Issue(t, testkit.CertOptions{})
	if err := healthCheck(t, e.srv.Addr, credentials.NewTLS(clientTLS(t, e.serverCA, &stranger, nil))); err == nil {
		t.Error("request mode accepted a certificate from another CA")
	}
}

// TestTLSRotation replaces the server's certificate (by another CA's) on
// disk: new connections get the new one without a restart, a connection
// opened before keeps working without a new handshake, and a broken file
// keeps the last good certificate in force.
func TestTLSRotation(t *testing.T) {
	e := startTLS(t, "")
	var oldHandshakes atomic.Int32
	conn, err := grpc.NewClient(e.srv.Addr, grpc.WithTransportCredentials(
		credentials.NewTLS(clientTLS(t, e.serverCA, nil, &oldHandshakes))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	old := lockdv1.NewLockServiceClient(conn)
	ctx := testkit.Context(t, 20*time.Second)
	if _, err := old.Inspect(ctx, &lockdv1.InspectRequest{Key: "rot/a"}); err != nil {
		t.Fatalf("Inspect before rotation: %v", err)
	}

	newCA := testkit.NewCA(t, "rotated-ca")
	newCA.Issue(t, testkit.CertOptions{}).Write(t, e.dir, "server")
	newCreds := credentials.NewTLS(clientTLS(t, newCA, nil, nil))
	testkit.Eventually(t, 5*time.Second, "a new connection verifies against the rotated CA", func() error {
		return healthCheck(t, e.srv.Addr, newCreds)
	})
	if err := healthCheck(t, e.srv.Addr, credentials.NewTLS(clientTLS(t, e.serverCA, nil, nil))); err == nil {
		t.Error("a new connection still got the old certificate after rotation")
	}
	if _, err := old.Inspect(ctx, &lockdv1.InspectRequest{Key: "rot/a"}); err != nil {
		t.Errorf("Inspect on the connection opened before rotation: %v", err)
	}
	if n := oldHandshakes.Load(); n != 1 {
		t.Errorf("the connection opened before rotation did %d handshakes, want 1 (kept, not redialled)", n)
	}
	if got := len(e.logs.Events("tls_reloaded")); got != 1 {
		t.Errorf("tls_reloaded logged %d times, want 1:\n%s", got, e.logs)
	}

	// A broken certificate file: the rotated certificate stays in force and
	// the failure is logged once.
	if err := os.WriteFile(filepath.Join(e.dir, "server.crt"), []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := healthCheck(t, e.srv.Addr, newCreds); err != nil {
			t.Fatalf("health check after a broken certificate file: %v", err)
		}
	}
	if got := len(e.logs.Events("tls_reload_failed")); got != 1 {
		t.Errorf("tls_reload_failed logged %d times, want 1:\n%s", got, e.logs)
	}
	if err := e.srv.ReloadTLS(); err == nil || !strings.Contains(err.Error(), "lock.server.tls.cert-file") {
		t.Errorf("ReloadTLS with a broken file = %v, want an error naming lock.server.tls.cert-file", err)
	}
}

// TestPeerCertificate: a handler sees the verified client certificate
// (what an authenticating interceptor reads the identity from).
func TestPeerCertificate(t *testing.T) {
	ca := testkit.NewCA(t, "ca")
	dir := t.TempDir()
	cfg := lockdtest.Config()
	cfg.TLSCertFile, cfg.TLSKeyFile = ca.Issue(t, testkit.CertOptions{}).Write(t, dir, "server")
	cfg.TLSClientCAFile = ca.WriteCA(t, dir, "ca.pem")
	r, err := server.NewTLSReloader(cfg.GRPCTLS(), "grpc", []string{"h2"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *x509.Certificate, 1)
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(r.Config())), grpc.UnaryInterceptor(
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			got <- server.PeerCertificate(ctx)
			return h(ctx, req)
		}))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }() // exits at Stop
	t.Cleanup(gs.Stop)
	alice := ca.Issue(t, testkit.CertOptions{CommonName: "alice"})
	if err := healthCheck(t, lis.Addr().String(), credentials.NewTLS(clientTLS(t, ca, &alice, nil))); err != nil {
		t.Fatal(err)
	}
	if c := <-got; c == nil || c.Subject.CommonName != "alice" {
		t.Errorf("PeerCertificate = %v, want alice's certificate", c)
	}
	if c := server.PeerCertificate(context.Background()); c != nil {
		t.Errorf("PeerCertificate without a peer = %v, want nil", c)
	}
}

func TestNewRefusesBadTLSFiles(t *testing.T) {
	cfg := lockdtest.Config()
	cfg.TLSCertFile, cfg.TLSKeyFile = filepath.Join(t.TempDir(), "missing.crt"), filepath.Join(t.TempDir(), "missing.key")
	_, err := server.New(cfg, anyStore(t), server.Options{})
	if err == nil || !strings.Contains(err.Error(), "lock.server.tls.cert-file") {
		t.Errorf("server.New with missing certificate files = %v, want an error naming lock.server.tls.cert-file", err)
	}
}

func TestInsecureRemoteListenerIsLogged(t *testing.T) {
	cfg := lockdtest.Config()
	cfg.Listen = "0.0.0.0:0"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "lock.server.tls.cert-file") {
		t.Fatalf("Validate with 0.0.0.0 and no TLS = %v, want an error naming lock.server.tls.cert-file", err)
	}
	cfg.InsecureAllowRemote = true
	logger, logs := testkit.NewLogger()
	srv, err := server.New(cfg, anyStore(t), server.Options{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := len(logs.Events("insecure_listener")); got != 1 {
		t.Errorf("insecure_listener logged %d times, want 1:\n%s", got, logs)
	}
}

// anyStore is a store for servers a test only starts and stops.
func anyStore(t *testing.T) store.LockStore {
	return lockdtest.NewNamespace(t, backend.Etcd).OpenStore(t, lockdtest.StoreOptions{})
}
