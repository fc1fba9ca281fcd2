package runner

import (
	"errors"
	"net"
	"syscall"
	"testing"
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
	if !l.hold {
		t.Fatal("holdAddr: no socket bound")
	}
	if c, err := net.Dial("tcp", addr.String()); err == nil {
		c.Close()
		t.Fatal("dial of a held address connected; want refused")
	}

	// Another socket without SO_REUSEADDR, as an outgoing connection's.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	sa := &syscall.SockaddrInet4{Port: addr.Port, Addr: [4]byte{127, 0, 0, 1}}
	if err := syscall.Bind(fd, sa); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("bind of a held port by another socket: %v; want EADDRINUSE", err)
	}

	// The restarted server binds and listens while the hold is in place.
	srv, err := net.Listen("tcp", addr.String())
	if err != nil {
		t.Fatalf("listen on a held address: %v", err)
	}
	defer srv.Close()
	l.releaseAddr()
	if l.hold {
		t.Error("releaseAddr left the hold")
	}
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatalf("dial of the restarted server: %v", err)
	}
	c.Close()
}
