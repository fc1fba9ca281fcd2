package runner

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// lockdReadyTimeout bounds a lockd start (the embedded backend starts etcd
// first).
const lockdReadyTimeout = 60 * time.Second

// lockdConfig is what a lockd process is started with.
type lockdConfig struct {
	name    string // e.g. lockd0
	bin     string
	dir     string // logs; the embedded backend's data dir lives below
	backend string // embedded, etcd or pg
	ttl     time.Duration
	margin  time.Duration
	reaper  time.Duration
	etcd    []string // endpoints (backend etcd)
	// autoSync is --etcd-auto-sync-interval (backend etcd); "": lockd's
	// default.
	autoSync string
	prefix   string // etcd prefix
	pgDSN    string
}

// lockdProc is one lockd server (`lockd serve`): restartable on the same
// gRPC address, with the same data directory.
type lockdProc struct {
	cfg lockdConfig

	mu    sync.Mutex
	addr  string // fixed after the first start
	p     *process
	start int      // incarnations started
	gone  addrHold // addr, while the server is down (holdAddr)
}

func (c lockdConfig) args(listen string) []string {
	args := []string{"serve",
		"--backend", c.backend,
		"--listen", listen,
		"--metrics-listen", "off",
		"--session-ttl", c.ttl.String(),
		"--safety-margin", c.margin.String(),
	}
	switch c.backend {
	case "embedded":
		args = append(args, "--data-dir", filepath.Join(c.dir, c.name+"-data"))
	case "etcd":
		args = append(args, "--etcd-endpoints", strings.Join(c.etcd, ","), "--etcd-prefix", c.prefix)
		if c.autoSync != "" {
			args = append(args, "--etcd-auto-sync-interval", c.autoSync)
		}
	case "pg":
		args = append(args, "--pg-dsn", c.pgDSN, "--pg-reaper-interval", c.reaper.String())
	}
	return args
}

// startLockd starts a lockd on a kernel-chosen port.
func startLockd(cfg lockdConfig) (*lockdProc, error) {
	l := &lockdProc{cfg: cfg}
	if err := l.launch("127.0.0.1:0"); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *lockdProc) launch(listen string) error {
	l.mu.Lock()
	l.start++
	n := l.start
	l.mu.Unlock()
	ready := make(chan string, 1)
	onLine := func(line string) {
		// lockd serving grpc=HOST:PORT metrics=... backend=...
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "lockd" && f[1] == "serving" &&
			strings.HasPrefix(f[2], "grpc=") {
			select {
			case ready <- strings.TrimPrefix(f[2], "grpc="):
			default:
			}
		}
	}
	name := fmt.Sprintf("%s.%d", l.cfg.name, n)
	p, err := startProcess(name, l.cfg.bin, l.cfg.args(listen), nil,
		filepath.Join(l.cfg.dir, l.cfg.name+".log"), noAnswer(onLine))
	if err != nil {
		return err
	}
	addr, err := waitLine(p, ready, lockdReadyTimeout)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.p, l.addr = p, addr
	l.mu.Unlock()
	return nil
}

// Addr returns the gRPC address.
func (l *lockdProc) Addr() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.addr
}

func (l *lockdProc) proc() *process {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.p
}

// kill SIGKILLs the server, waits for it to exit and holds its address
// until restart.
func (l *lockdProc) kill() {
	l.proc().kill()
	l.holdAddr()
}

// down waits for the server to exit (a SIGKILL the caller sent) and holds
// its address until restart.
func (l *lockdProc) down() {
	<-l.proc().exited
	l.holdAddr()
}

// holdAddr holds the address of the server, which has exited, until
// restart has started it again (addrHold).
func (l *lockdProc) holdAddr() { l.gone.hold(l.Addr()) }

// bindHold binds a socket to the TCP address addr (IPv4) without listening
// on it: connections to addr are refused, and the kernel hands the port to
// no other socket until the returned descriptor is closed. ok is false
// when that failed (nothing to close then).
func bindHold(addr string) (fd int, ok bool) {
	ap, err := net.ResolveTCPAddr("tcp4", addr)
	if err != nil || ap.IP.To4() == nil {
		return 0, false
	}
	fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	sa := &syscall.SockaddrInet4{Port: ap.Port}
	copy(sa.Addr[:], ap.IP.To4())
	if syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) != nil || syscall.Bind(fd, sa) != nil {
		_ = syscall.Close(fd)
		return 0, false
	}
	return fd, true
}

// releaseAddr closes the socket holdAddr bound, if any.
func (l *lockdProc) releaseAddr() { l.gone.release() }

// restart starts the server again on its address, retrying while the port
// is still being released, then releases the address's hold.
func (l *lockdProc) restart() error {
	defer l.releaseAddr()
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if err = l.launch(l.Addr()); err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("restart %s: %w", l.cfg.name, err)
}

// stop shuts the server down (SIGTERM), killing it after a timeout. It
// returns an error when the server had already exited: the harness restarts
// every server it kills, so that one died on its own.
func (l *lockdProc) stop() error {
	p := l.proc()
	if p.done() {
		return p.failure()
	}
	if p.stop(40 * time.Second) {
		return fmt.Errorf("%s did not stop within 40s of SIGTERM; killed it", p.name)
	}
	return nil
}
