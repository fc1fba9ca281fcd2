package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) {
	testkit.Main(m, nil)
}

// lineWriter collects what is written and sends the first complete line on
// lines (buffered, capacity 1).
type lineWriter struct {
	buf   bytes.Buffer
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	if i := bytes.IndexByte(w.buf.Bytes(), '\n'); i >= 0 && w.lines != nil {
		w.lines <- string(w.buf.Bytes()[:i])
		w.lines = nil
	}
	return len(p), nil
}

func TestRunServesUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &lineWriter{lines: make(chan string, 1)}
	lines := out.lines
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--data-dir", filepath.Join(t.TempDir(), "data")}, out, io.Discard) }()

	var line string
	select {
	case line = <-lines:
	case err := <-done:
		t.Fatalf("run returned %v before printing its endpoints", err)
	case <-time.After(60 * time.Second):
		t.Fatal("no endpoints line within 60s")
	}
	ep, ok := strings.CutPrefix(line, "etcd serving endpoints=")
	if !ok || !strings.HasPrefix(ep, "http://127.0.0.1:") {
		t.Fatalf("stdout line %q; want etcd serving endpoints=http://127.0.0.1:PORT", line)
	}

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("clientv3.New(%s): %v", ep, err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = cli.Put(pctx, "k", "v")
	pcancel()
	cli.Close()
	if err != nil {
		t.Fatalf("Put through %s: %v", ep, err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel = %v; want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return within 30s of cancellation")
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--data-dir", t.TempDir(), "extra"},
		{"--no-such-flag"},
		{"--data-dir", t.TempDir(), "--initial-cluster-state", "bogus"},
		{"--data-dir", t.TempDir(), "--cert-file", "server.crt", "--key-file", "server.key"}, // no --client-ca-file
	} {
		err := run(context.Background(), args, io.Discard, io.Discard)
		if !errors.Is(err, errUsage) {
			t.Errorf("run(%q) = %v; want a usage error", args, err)
		}
	}
	err := run(context.Background(), []string{"--data-dir", t.TempDir(), "--client-url", "http://10.1.2.3:2379"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("run with a non-loopback client URL = %v; want a loopback error", err)
	}
}

// TestRunTLS serves clients over mTLS: a client with a certificate of the
// client CA writes; one without a certificate is refused.
func TestRunTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testkit.NewCA(t, "etcd-ca")
	caFile := ca.WriteCA(t, dir, "ca.crt")
	certFile, keyFile := ca.Issue(t, testkit.CertOptions{}).Write(t, dir, "server")
	clientCert := ca.Issue(t, testkit.CertOptions{CommonName: "lockd"}).TLS(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &lineWriter{lines: make(chan string, 1)}
	lines := out.lines
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--data-dir", filepath.Join(dir, "data"),
			"--cert-file", certFile, "--key-file", keyFile, "--client-ca-file", caFile}, out, io.Discard)
	}()
	var line string
	select {
	case line = <-lines:
	case err := <-done:
		t.Fatalf("run returned %v before printing its endpoints", err)
	case <-time.After(60 * time.Second):
		t.Fatal("no endpoints line within 60s")
	}
	ep, ok := strings.CutPrefix(line, "etcd serving endpoints=")
	if !ok || !strings.HasPrefix(ep, "https://127.0.0.1:") {
		t.Fatalf("stdout line %q; want etcd serving endpoints=https://127.0.0.1:PORT", line)
	}

	put := func(certs []tls.Certificate) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
			TLS: &tls.Config{RootCAs: ca.Pool(), Certificates: certs, MinVersion: tls.VersionTLS12}})
		if err != nil {
			return err
		}
		defer cli.Close()
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		defer pcancel()
		_, err = cli.Put(pctx, "k", "v")
		return err
	}
	if err := put([]tls.Certificate{clientCert}); err != nil {
		t.Fatalf("Put with a client certificate through %s: %v", ep, err)
	}
	if err := put(nil); err == nil {
		t.Error("Put without a client certificate succeeded; want it refused")
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel = %v; want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return within 30s of cancellation")
	}
}

// TestRunExitsWhenRemoved: a member added to a running cluster (a learner,
// --initial-cluster-state existing, an empty data directory) serves, and
// once removed from the cluster it stops: run calls the hook where main
// exits 0 at once, as etcd's own main does, and returns nil.
func TestRunExitsWhenRemoved(t *testing.T) {
	testkit.AwaitGone(t, 15*time.Second, testkit.PeerConnFrames...) // two etcd members in this process
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	aPeer, bPeer := "http://"+freeAddr(t), "http://"+freeAddr(t)
	start := func(removed func(), args ...string) (ep string, done <-chan error, stderr *lineWriter) {
		t.Helper()
		out := &lineWriter{lines: make(chan string, 1)}
		lines := out.lines
		errw := &lineWriter{}
		ch := make(chan error, 1)
		go func() { ch <- runWith(ctx, args, out, errw, removed) }()
		select {
		case line := <-lines:
			ep, _ = strings.CutPrefix(line, "etcd serving endpoints=")
		case err := <-ch:
			t.Fatalf("run(%q) returned %v before serving", args, err)
		case <-time.After(60 * time.Second):
			t.Fatalf("run(%q): no endpoints line within 60s", args)
		}
		return ep, ch, errw
	}
	aEP, aDone, _ := start(func() { t.Error("member a reported removed") }, "--data-dir", filepath.Join(dir, "a"), "--name", "a", "--peer-url", aPeer,
		"--initial-cluster", "a="+aPeer)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{aEP}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("clientv3.New(%s): %v", aEP, err)
	}
	defer cli.Close()
	add, err := cli.MemberAddAsLearner(ctx, []string{bPeer})
	if err != nil {
		t.Fatalf("MemberAddAsLearner(%s): %v", bPeer, err)
	}
	hooked := make(chan struct{})
	_, bDone, bErr := start(func() { close(hooked) }, "--data-dir", filepath.Join(dir, "b"), "--name", "b", "--peer-url", bPeer,
		"--initial-cluster", "a="+aPeer+",b="+bPeer, "--initial-cluster-state", "existing")
	if _, err := cli.MemberRemove(ctx, add.Member.ID); err != nil {
		t.Fatalf("MemberRemove(b): %v", err)
	}
	select {
	case err := <-bDone:
		if err != nil {
			t.Fatalf("run of the removed member = %v; want nil", err)
		}
		select {
		case <-hooked:
		default:
			t.Error("run of the removed member returned without calling its removed hook (main's exit)")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the removed member's run did not return within 30s")
	}
	if !strings.Contains(bErr.buf.String(), "server stopped") {
		t.Errorf("the removed member's stderr does not say it stopped:\n%s", bErr.buf.String())
	}
	cancel()
	select {
	case err := <-aDone:
		if err != nil {
			t.Fatalf("run of member a after cancel = %v; want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("member a did not stop within 30s of cancellation")
	}
}

// freeAddr returns a free loopback host:port.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
