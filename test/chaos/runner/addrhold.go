package runner

import (
	"net/url"
	"sync"
	"syscall"
)

// addrHold keeps the addresses of a process the harness killed bound
// (bindHold) until it is started again on them: clients that dial them are
// refused as before, but the kernel hands the ports to no other socket
// meanwhile (no bind to port 0, no outgoing connection's local port).
// Without it a restart failed with "address already in use": a lockd once,
// 5 s after its kill, and an etcd member in a clean-clone CI run
// (leader-kill-etcd3, 2026-12-06: five binds over 1 s all refused). Both
// sockets set SO_REUSEADDR (Go's listeners do), so the new process binds and
// listens while the hold is in place; the restart releases it then. A hold
// that fails is no error: the restart just runs without one.
type addrHold struct {
	mu  sync.Mutex
	fds []int
}

// hold binds every address (host:port, IPv4) not yet held.
func (h *addrHold) hold(addrs ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.fds) > 0 {
		return
	}
	for _, a := range addrs {
		if fd, ok := bindHold(a); ok {
			h.fds = append(h.fds, fd)
		}
	}
}

// release closes the sockets hold bound, if any.
func (h *addrHold) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, fd := range h.fds {
		_ = syscall.Close(fd)
	}
	h.fds = nil
}

// held reports whether any address is held.
func (h *addrHold) held() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.fds) > 0
}

// hostPort returns the host:port of a URL such as http://127.0.0.1:2379.
func hostPort(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return ""
	}
	return p.Host
}
