package backend_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// roundTrip opens a session, takes a key and closes the session.
func roundTrip(t *testing.T, b *backend.Backend) {
	t.Helper()
	ctx := testkit.Context(t, 30*time.Second)
	s, err := b.OpenSession(ctx, 5*time.Second)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	if g, ok, err := b.TryInsert(ctx, s.ID, "tls/k"); err != nil || !ok || g.Token == 0 {
		t.Fatalf("TryInsert = %+v, %v, %v; want a grant", g, ok, err)
	}
	if n, err := b.CloseSession(ctx, s.ID); err != nil || n != 1 {
		t.Fatalf("CloseSession = %d, %v; want 1, nil", n, err)
	}
}

// TestEmbeddedSocket: the embedded etcd serves its clients only on a unix
// socket inside the data dir, which is mode 0700.
func TestEmbeddedSocket(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := backend.DefaultConfig()
	cfg.EmbeddedDataDir = dir
	b, err := backend.Open(testkit.Context(t, time.Minute), cfg, nil, nil)
	if err != nil {
		t.Fatalf("Open(embedded): %v", err)
	}
	defer b.Close()
	want := "unix://" + filepath.Join(dir, embedetcd.SocketName)
	if eps := b.Endpoints(); len(eps) != 1 || eps[0] != want {
		t.Errorf("Endpoints() = %v, want [%s]", eps, want)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		t.Errorf("data dir mode = %v, want 0700 (only lockd's user reaches the socket)", perm)
	}
	roundTrip(t, b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// A restart finds the socket file left behind and reuses the path.
	b2, err := backend.Open(testkit.Context(t, time.Minute), cfg, nil, nil)
	if err != nil {
		t.Fatalf("Open(embedded) again on the same data dir: %v", err)
	}
	defer b2.Close()
	roundTrip(t, b2)
}

// tlsEtcd starts an etcd that requires TLS client certificates, standing in
// for an external one, and returns its endpoints and the files a client
// needs (CA, client certificate and key of user root).
func tlsEtcd(t *testing.T) (endpoints []string, caFile, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	ca := testkit.NewCA(t, "etcd-ca")
	caFile = ca.WriteCA(t, dir, "ca.pem")
	srvCert, srvKey := ca.Issue(t, testkit.CertOptions{}).Write(t, dir, "etcd")
	certFile, keyFile = ca.Issue(t, testkit.CertOptions{CommonName: "root"}).Write(t, dir, "lockd")
	srv, err := embedetcd.Start(testkit.Context(t, time.Minute), embedetcd.Config{DataDir: filepath.Join(dir, "data"),
		ClientTLS: &embedetcd.TLSFiles{CertFile: srvCert, KeyFile: srvKey, ClientCAFile: caFile}})
	if err != nil {
		t.Fatalf("start etcd with TLS: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv.Endpoints(), caFile, certFile, keyFile
}

// TestEtcdTLS: lockd reaches an external etcd over TLS with a client
// certificate, then with a user and a password file once auth is on.
func TestEtcdTLS(t *testing.T) {
	eps, caFile, certFile, keyFile := tlsEtcd(t)
	if !strings.HasPrefix(eps[0], "https://") {
		t.Fatalf("TLS etcd endpoints = %v, want https://", eps)
	}
	cfg := backend.DefaultConfig()
	cfg.Kind, cfg.EtcdEndpoints, cfg.EtcdDialTimeout = backend.Etcd, eps, 2*time.Second
	cfg.EtcdTLSCAFile, cfg.EtcdTLSCertFile, cfg.EtcdTLSKeyFile = caFile, certFile, keyFile
	ctx := testkit.Context(t, time.Minute)

	b, err := backend.Open(ctx, cfg, nil, nil)
	if err != nil {
		t.Fatalf("Open(etcd over mTLS): %v", err)
	}
	roundTrip(t, b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	// Without a client certificate the etcd refuses lockd.
	noCert := cfg
	noCert.EtcdTLSCertFile, noCert.EtcdTLSKeyFile = "", ""
	if b, err := backend.Open(ctx, noCert, nil, nil); err == nil {
		b.Close()
		t.Error("Open(etcd over TLS without a client certificate) succeeded, want an error")
	}

	// Turn auth on (user root, role root) and use a password file.
	const password = "pa55-w0rd-for-etcd"
	tlsCfg, err := cfgTLS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: tlsCfg, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.UserAdd(ctx, "root", password); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	pwFile := filepath.Join(t.TempDir(), "etcd-password")
	if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withPW := cfg
	withPW.EtcdUsername, withPW.EtcdPasswordFile = "root", pwFile
	withPW.EtcdDialTimeout = 30 * time.Second // bcrypt under -race is slow
	b, err = backend.Open(ctx, withPW, nil, nil)
	if err != nil {
		t.Fatalf("Open(etcd with user and password file): %v", err)
	}
	roundTrip(t, b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	const wrong = "not-the-password-123"
	if err := os.WriteFile(pwFile, []byte(wrong), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err = backend.Open(ctx, withPW, nil, nil)
	if err == nil {
		b.Close()
		t.Fatal("Open(etcd with a wrong password) succeeded, want an error")
	}
	if strings.Contains(err.Error(), wrong) {
		t.Errorf("Open error shows the password: %v", err)
	}
	withPW.EtcdPasswordFile = filepath.Join(t.TempDir(), "missing")
	if _, err := backend.Open(ctx, withPW, nil, nil); err == nil || !strings.Contains(err.Error(), "lock.etcd.password-file") {
		t.Errorf("Open with a missing password file = %v, want an error naming lock.etcd.password-file", err)
	}
}

// TestPGSecretsNotInErrors: a DSN's password never shows in Open's error,
// whether the DSN is unreachable or malformed, given inline or in a file.
func TestPGSecretsNotInErrors(t *testing.T) {
	const secret = "Sup3r-s3cret-pw"
	dsnFile := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(dsnFile, []byte("postgres://lockd:"+secret+"@127.0.0.1:1/x?connect_timeout=1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, set := range map[string]func(*backend.Config){
		"url": func(c *backend.Config) { c.PGDSN = "postgres://lockd:" + secret + "@127.0.0.1:1/x?connect_timeout=1" },
		"key-value": func(c *backend.Config) {
			c.PGDSN = "host=127.0.0.1 port=1 user=lockd password=" + secret + " dbname=x connect_timeout=1"
		},
		"quoted":    func(c *backend.Config) { c.PGDSN = "host=127.0.0.1 port=1 password='" + secret + "' connect_timeout=1" },
		"malformed": func(c *backend.Config) { c.PGDSN = "postgres://lockd:" + secret + "@127.0.0.1:notaport/x" },
		"bad param": func(c *backend.Config) { c.PGDSN = "host=127.0.0.1 password=" + secret + " sslmode=bogus" },
		"dsn-file":  func(c *backend.Config) { c.PGDSNFile = dsnFile },
	} {
		cfg := backend.DefaultConfig()
		cfg.Kind = backend.PG
		set(&cfg)
		logger, logs := testkit.NewLogger()
		b, err := backend.Open(testkit.Context(t, time.Minute), cfg, logger, nil)
		if err == nil {
			b.Close()
			t.Errorf("%s: Open succeeded, want an error", name)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s: Open error shows the password: %v", name, err)
		}
		if strings.Contains(logs.String(), secret) {
			t.Errorf("%s: logs show the password:\n%s", name, logs)
		}
	}
}

// TestPGDSNFile: lock.pg.dsn-file opens a real database.
func TestPGDSNFile(t *testing.T) {
	dsnFile := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(dsnFile, []byte(pgtest.NewDatabase(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := backend.DefaultConfig()
	cfg.Kind, cfg.PGDSNFile, cfg.PGSchema = backend.PG, dsnFile, "lockd_dsn_file"
	logger, logs := testkit.NewLogger()
	b, err := backend.Open(testkit.Context(t, time.Minute), cfg, logger, nil)
	if err != nil {
		t.Fatalf("Open(pg, lock.pg.dsn-file): %v", err)
	}
	defer b.Close()
	roundTrip(t, b)
	if strings.Contains(logs.String(), "pg_tls_weak") {
		t.Errorf("pg_tls_weak logged for a local PostgreSQL:\n%s", logs)
	}
}

// TestPGWeakTLSWarning: a non-local host with an sslmode below verify-full
// is logged at start (the connection itself fails here: nobody listens).
func TestPGWeakTLSWarning(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://lockd@192.0.2.1:5432/x?connect_timeout=1&sslmode=disable":     "optional",
		"postgres://lockd@192.0.2.1:5432/x?connect_timeout=1":                     "optional", // prefer
		"postgres://lockd@192.0.2.1:5432/x?connect_timeout=1&sslmode=require":     "unverified",
		"postgres://lockd@192.0.2.1:5432/x?connect_timeout=1&sslmode=verify-full": "",
		"postgres://lockd@127.0.0.1:1/x?connect_timeout=1&sslmode=disable":        "",
		"host=/tmp port=1 user=lockd dbname=x connect_timeout=1 sslmode=disable":  "",
	} {
		cfg := backend.DefaultConfig()
		cfg.Kind, cfg.PGDSN = backend.PG, dsn
		logger, logs := testkit.NewLogger()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		if b, err := backend.Open(ctx, cfg, logger, nil); err == nil {
			b.Close()
		}
		cancel()
		var got string
		for _, r := range logs.Records() {
			if r["msg"] == "pg_tls_weak" {
				got, _ = r["tls"].(string)
			}
		}
		if got != want {
			t.Errorf("%s: pg_tls_weak tls=%q, want %q\n%s", dsn, got, want, logs)
		}
	}
}

// cfgTLS is the client TLS of cfg's lock.etcd.tls.* files.
func cfgTLS(cfg backend.Config) (*tls.Config, error) {
	pem, err := os.ReadFile(cfg.EtcdTLSCAFile)
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(cfg.EtcdTLSCertFile, cfg.EtcdTLSKeyFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}, nil
}

// TestEtcdTLSRotation: the client certificate and CA bundle lockd uses for
// an external etcd are re-read when the files change (C5 #ct5-tls), without
// reopening the backend. etcd restarts with a certificate of another CA and
// trusts only that CA's clients, so neither the old certificate nor the old
// CA bundle can make a connection any more: a store call succeeds again only
// through a new handshake with the rotated files.
func TestEtcdTLSRotation(t *testing.T) {
	ca1, ca2 := testkit.NewCA(t, "etcd-ca-1"), testkit.NewCA(t, "etcd-ca-2")
	etcd := etcdtest.StartMTLS(t, ca1)
	dir := t.TempDir()
	cfg := backend.DefaultConfig()
	cfg.Kind, cfg.EtcdEndpoints, cfg.EtcdDialTimeout = backend.Etcd, etcd.Endpoints(), 10*time.Second
	cfg.EtcdTLSCAFile = ca1.WriteCA(t, dir, "ca.pem")
	cfg.EtcdTLSCertFile, cfg.EtcdTLSKeyFile = ca1.Issue(t, testkit.CertOptions{CommonName: "lockd-a"}).Write(t, dir, "lockd")
	logger, logs := testkit.NewLogger()
	b, err := backend.Open(testkit.Context(t, time.Minute), cfg, logger, nil)
	if err != nil {
		t.Fatalf("Open(etcd over mTLS): %v", err)
	}
	defer b.Close()
	roundTrip(t, b)

	// Rotate while etcd is down, so no handshake reads a half-written set
	// (each file is replaced by a rename, but the three not at once).
	etcd.Stop()
	ca2.WriteCA(t, dir, "ca.pem")
	ca2.Issue(t, testkit.CertOptions{CommonName: "lockd-b"}).Write(t, dir, "lockd")
	etcd.Start(t, ca2)
	// Bound: the client redials within its reconnect backoff (at most 1 s,
	// etcdstore.ClientConfig) and a single-node etcd elects itself within
	// its election timeout (1 s); 30 s leaves room for a loaded 2-core
	// machine running -race. The old code presents certificate A for ever.
	testkit.Eventually(t, 30*time.Second, "a store call through a new connection with the rotated files", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s, err := b.OpenSession(ctx, 5*time.Second)
		if err != nil {
			return err
		}
		_, err = b.CloseSession(ctx, s.ID)
		return err
	})
	reloaded := logs.Events("tls_reloaded")
	if len(reloaded) != 1 || reloaded[0]["listener"] != "etcd" {
		t.Errorf("tls_reloaded = %v, want one with listener etcd:\n%s", reloaded, logs)
	}

	// A broken certificate file: the rotated files stay in force, the error
	// names the key, and the failure is logged once.
	if err := os.WriteFile(cfg.EtcdTLSCertFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := b.ReloadTLS(); err == nil || !strings.Contains(err.Error(), "lock.etcd.tls.cert-file") {
			t.Errorf("ReloadTLS with a broken file = %v, want an error naming lock.etcd.tls.cert-file", err)
		}
	}
	if failed := logs.Events("tls_reload_failed"); len(failed) != 1 || failed[0]["listener"] != "etcd" {
		t.Errorf("tls_reload_failed = %v, want one with listener etcd:\n%s", failed, logs)
	}
	roundTrip(t, b)
}
