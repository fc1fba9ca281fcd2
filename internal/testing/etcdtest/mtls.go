package etcdtest

import (
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/testing/testkit"
)

// MTLS is an etcd server of a test's own that serves clients over TLS and
// requires client certificates (an external etcd reached through
// lock.etcd.tls.*). It can be stopped and started again on the same URLs
// and data with another CA's files: the way to make a client's old
// certificate unusable (certificate rotation tests).
type MTLS struct {
	dir                string // data and the server's TLS files
	clientURL, peerURL string // http URLs given to embedetcd (https with TLS)
	endpoints          []string
	srv                *embedetcd.Server // nil while stopped
}

// StartMTLS starts an etcd whose server certificate ca issued and which
// accepts only client certificates that chain to ca. The test's cleanup
// stops it.
func StartMTLS(t testing.TB, ca *testkit.CA) *MTLS {
	t.Helper()
	e := &MTLS{dir: t.TempDir()}
	e.Start(t, ca)
	srvURL, err := url.Parse(e.endpoints[0])
	if err != nil {
		t.Fatalf("etcdtest: endpoint %q: %v", e.endpoints[0], err)
	}
	e.clientURL = "http://" + srvURL.Host
	e.peerURL = "http://" + e.srv.PeerAddrs()[0].String()
	t.Cleanup(e.Stop)
	return e
}

// Endpoints returns the https client URLs (the same after a restart).
func (e *MTLS) Endpoints() []string { return append([]string(nil), e.endpoints...) }

// Stop stops the server (it keeps its data and URLs). Stopping a stopped
// server does nothing.
func (e *MTLS) Stop() {
	if e.srv != nil {
		e.srv.Close()
		e.srv = nil
	}
}

// Start starts the stopped server again, on the same URLs and data, with a
// server certificate of ca, accepting only client certificates that chain
// to ca.
func (e *MTLS) Start(t testing.TB, ca *testkit.CA) {
	t.Helper()
	if e.srv != nil {
		t.Fatal("etcdtest: MTLS.Start on a running server")
	}
	name := ca.Cert.Subject.CommonName
	certFile, keyFile := ca.Issue(t, testkit.CertOptions{}).Write(t, e.dir, "server-"+name)
	caFile := ca.WriteCA(t, e.dir, "client-ca-"+name+".pem")
	srv, err := embedetcd.Start(testkit.Context(t, time.Minute), embedetcd.Config{
		DataDir: filepath.Join(e.dir, "data"), ClientURL: e.clientURL, PeerURL: e.peerURL,
		ClientTLS: &embedetcd.TLSFiles{CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile},
	})
	if err != nil {
		t.Fatalf("etcdtest: start etcd with client certificates of %s: %v", name, err)
	}
	e.srv, e.endpoints = srv, srv.Endpoints()
}
