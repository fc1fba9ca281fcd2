package runner

import (
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"lock.dev/lockd/internal/loopback"
)

// TestHoldAddr checks the hold of a dead server's address: a dial is
// refused as if nothing held it, another socket cannot take the port, the
// restarted server (a Go listener) can, and the hold is released after.
func TestHoldAddr(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	l := &lockdProc{addr: addr.String()}
	l.holdAddr()
	t.Cleanup(l.releaseAddr)
	if !l.gone.held() {
		t.Fatal("holdAddr: no socket bound")
	}
	if c, err := net.Dial("tcp", addr.String()); err == nil {
		c.Close()
		t.Fatal("dial of a held address connected; want refused")
	}

	if err := bindPlain(addr.Port); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("bind of a held port by another socket: %v; want EADDRINUSE", err)
	}

	// The restarted server binds and listens while the hold is in place.
	srv, err := net.Listen("tcp", addr.String())
	if err != nil {
		t.Fatalf("listen on a held address: %v", err)
	}
	defer srv.Close()
	l.releaseAddr()
	if l.gone.held() {
		t.Error("releaseAddr left the hold")
	}
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatalf("dial of the restarted server: %v", err)
	}
	c.Close()
}

// bindPlain binds a socket without SO_REUSEADDR, as an outgoing
// connection's, to 127.0.0.1:port and closes it.
func bindPlain(port int) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	return syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
}

// TestEtcdKillHoldsAddrs checks that a killed etcd member's client and peer
// ports stay held until it is started again or stopped: in a clean-clone CI
// run another socket took a killed leader's port and its restart failed
// five times with "address already in use" (leader-kill-etcd3).
func TestEtcdKillHoldsAddrs(t *testing.T) {
	ports, err := loopback.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p, err := startProcess("member", sleep, []string{"60"}, nil, filepath.Join(dir, "member.log"), nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &etcdNode{name: "etcd0", dir: dir, p: p,
		clientURL: fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		peerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[1])}
	e.kill()
	for _, port := range ports {
		if err := bindPlain(port); !errors.Is(err, syscall.EADDRINUSE) {
			t.Errorf("bind of killed member's port %d by another socket: %v; want EADDRINUSE", port, err)
		}
	}
	_ = e.stop() // the member died of SIGKILL: an error, and the hold released
	for _, port := range ports {
		if err := bindPlain(port); err != nil {
			t.Errorf("port %d after stop: %v; want released", port, err)
		}
	}
}
