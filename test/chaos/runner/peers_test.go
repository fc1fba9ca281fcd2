package runner

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// peerDial opens a connection to a member's peer proxy as the member with
// id from would, and checks that it is forwarded (echoed).
func peerDial(t *testing.T, addr, from string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	head := "GET /raft/stream/msgappv2/" + from + " HTTP/1.1\r\nHost: x\r\nX-Server-From: " + from + "\r\n\r\n"
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

// echoed reports whether the connection still forwards: the request head
// comes back first (the upstream echoes), then a line.
func echoed(c net.Conn, r *bufio.Reader, first bool) error {
	if first {
		if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			return err
		}
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return err
			}
			if line == "\r\n" {
				break
			}
		}
	}
	return roundTrip(c, r, "ping", 5*time.Second)
}

// closed reports whether the proxy closed the connection.
func closed(c net.Conn, r *bufio.Reader) bool {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(c, "ping\n")
	for {
		if _, err := r.ReadString('\n'); err != nil {
			var ne net.Error
			return !(errors.As(err, &ne) && ne.Timeout())
		}
	}
}

func TestPeerNetIsolate(t *testing.T) {
	pn := &peerNet{ids: map[string]string{"e0": "a0", "e1": "a1", "e2": "a2"}}
	defer pn.close()
	// e1's peer listener is an echo server; its proxy is what e0 and e2 dial.
	px, err := pn.listen(&etcdNode{name: "e1", peerURL: "http://" + echoServer(t)})
	if err != nil {
		t.Fatal(err)
	}
	addr := px.ln.Addr().String()
	c0, r0 := peerDial(t, addr, "a0")
	c2, r2 := peerDial(t, addr, "a2")
	for _, c := range []struct {
		c net.Conn
		r *bufio.Reader
	}{{c0, r0}, {c2, r2}} {
		if err := echoed(c.c, c.r, true); err != nil {
			t.Fatalf("before the cut: %v", err)
		}
	}

	// Isolating e0 cuts its link to e1, not e2's.
	if err := pn.isolate(context.Background(), nil, "e0"); err != nil {
		t.Fatal(err)
	}
	if !closed(c0, r0) {
		t.Error("e0's open link to e1 survived e0's isolation")
	}
	if err := echoed(c2, r2, false); err != nil {
		t.Errorf("e2's link to e1 after e0's isolation: %v", err)
	}
	if n0, nr0 := peerDial(t, addr, "a0"); !closed(n0, nr0) {
		t.Error("a new link from e0 was forwarded during its isolation")
	}
	if n2, nr2 := peerDial(t, addr, "a2"); echoed(n2, nr2, true) != nil {
		t.Error("a new link from e2 was cut during e0's isolation")
	}

	// Isolating e1, the proxied member, cuts every link to it.
	if err := pn.isolate(context.Background(), nil, "e1"); err != nil {
		t.Fatal(err)
	}
	if !closed(c2, r2) {
		t.Error("e2's open link to e1 survived e1's isolation")
	}

	pn.heal()
	if n0, nr0 := peerDial(t, addr, "a0"); echoed(n0, nr0, true) != nil {
		t.Error("a new link from e0 was cut after the heal")
	}
	if err := pn.isolate(context.Background(), nil, "e9"); err == nil {
		t.Error("isolating a member that does not exist: no error")
	}
}
