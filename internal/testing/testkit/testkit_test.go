package testkit

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"io"
	"net"
	"os/exec"
	"testing"
	"time"
)

func TestMain(m *testing.M) { Main(m, nil) }

func TestPoll(t *testing.T) {
	n := 0
	if err := Poll(time.Second, func() bool { n++; return n == 3 }); err != nil || n != 3 {
		t.Fatalf("Poll(bool) = %v after %d calls; want nil after 3", err, n)
	}
	want := errors.New("still down")
	if err := Poll(30*time.Millisecond, func() error { return want }); !errors.Is(err, want) {
		t.Fatalf("Poll(error) never nil = %v; want the last error %v", err, want)
	}
	if err := Poll(30*time.Millisecond, func() bool { return false }); err == nil {
		t.Fatal("Poll(false) = nil; want an error once the deadline passed")
	}
}

func TestChildEnv(t *testing.T) {
	t.Setenv("LOCKD_TESTKIT_X", "1")
	for _, kv := range ChildEnv([]string{"LOCKD_"}, "A=b") {
		if kv == "LOCKD_TESTKIT_X=1" {
			t.Fatalf("ChildEnv kept %s", kv)
		}
	}
	env := ChildEnv(nil, "A=b")
	if env[len(env)-1] != "A=b" {
		t.Fatalf("ChildEnv extra not last: %v", env[len(env)-1])
	}
}

func TestLogBufferEvents(t *testing.T) {
	log, buf := NewLogger()
	log.Info("lock_acquired", "key", "k")
	log.Info("other")
	if got := buf.Events("lock_acquired"); len(got) != 1 || got[0]["key"] != "k" {
		t.Fatalf("Events(lock_acquired) = %v; want one record with key k", got)
	}
}

// TestProxy: bytes flow, Pause holds them, Restore releases them, Cut drops
// the connection.
func TestProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // echo server; ends when the listener closes
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	p := NewProxy(t, ln.Addr().String())
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func(d time.Duration) error {
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(d))
		_, err := c.Read(make([]byte, 1))
		return err
	}
	if err := echo(5 * time.Second); err != nil {
		t.Fatalf("echo through the proxy: %v", err)
	}
	p.Pause()
	if err := echo(100 * time.Millisecond); err == nil {
		t.Fatal("echo answered while paused")
	}
	p.Restore()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil {
		t.Fatalf("held byte after Restore: %v", err)
	}
	p.Cut()
	if err := echo(5 * time.Second); err == nil {
		t.Fatal("echo answered after Cut")
	}
}

func TestCertsVerify(t *testing.T) {
	ca := NewCA(t, "test-ca")
	c := ca.Issue(t, CertOptions{})
	leaf, err := x509.ParseCertificate(c.TLS(t).Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "localhost",
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("issued certificate does not verify against its CA: %v", err)
	}
	other := NewCA(t, "other")
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: other.Pool()}); err == nil {
		t.Error("issued certificate verifies against another CA")
	}
	certFile, keyFile := c.Write(t, t.TempDir(), "srv")
	if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
		t.Errorf("written files do not load: %v", err)
	}
}

// lingering blocks until release is closed (a goroutine AwaitGone waits
// for); it closes started once it runs.
func lingering(started chan<- struct{}, release <-chan struct{}, done chan<- struct{}) {
	close(started)
	<-release
	close(done)
}

func TestAwaitGone(t *testing.T) {
	started, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	t.Run("waits", func(t *testing.T) {
		AwaitGone(t, 10*time.Second, "testkit.lingering")
		go lingering(started, release, done) // returns when the cleanup below closes release
		// A goroutine that has not run yet may not show its function in
		// runtime.Stack: the cleanup's check starts once it runs.
		<-started
		t.Cleanup(func() { time.AfterFunc(50*time.Millisecond, func() { close(release) }) })
	})
	select {
	case <-done:
	default:
		t.Fatal("AwaitGone returned while the goroutine still ran")
	}
}

// TestDefaultParallel: the package's default applies when the command line
// left -parallel alone, and an explicit -parallel wins.
func TestDefaultParallel(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{{nil, 4}, {[]string{"-test.parallel=1"}, 1}, {[]string{"-test.parallel", "7"}, 7}} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		p := fs.Int(parallelFlag, 2, "")
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if err := defaultParallel(fs, 4); err != nil || *p != c.want {
			t.Errorf("args %q: defaultParallel(4) = %v, -parallel %d; want nil, %d", c.args, err, *p, c.want)
		}
	}
	if err := defaultParallel(flag.NewFlagSet("x", flag.ContinueOnError), 4); err == nil {
		t.Error("defaultParallel on a flag set without -test.parallel = nil; want an error")
	}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.Int(parallelFlag, 2, "")
	if err := defaultParallel(fs, 0); err == nil {
		t.Error("defaultParallel(0) = nil; want an error")
	}
}

// TestStop: a running process is not stopped, Stop returns with every
// thread stopped, and a process reaped is gone.
func TestStop(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if stopped, gone := ThreadsStopped(pid); stopped || gone {
		t.Fatalf("a running process: ThreadsStopped = %v, %v; want false, false", stopped, gone)
	}
	Stop(t, cmd.Process, 10*time.Second)
	if stopped, gone := ThreadsStopped(pid); !stopped || gone {
		t.Fatalf("after Stop: ThreadsStopped = %v, %v; want true, false", stopped, gone)
	}
	_ = cmd.Process.Kill() // SIGKILL ends a stopped process too
	_ = cmd.Wait()
	if _, gone := ThreadsStopped(pid); !gone {
		t.Fatal("a process reaped: ThreadsStopped says it is not gone")
	}
}
