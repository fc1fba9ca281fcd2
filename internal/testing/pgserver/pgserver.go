package pgserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/loopback"
)

const (
	// readyTimeout bounds a server's start, crash recovery included.
	readyTimeout = 60 * time.Second
	// stopTimeout bounds a shutdown; the server is killed after it.
	stopTimeout = 60 * time.Second
	// portAttempts bounds the starts on fresh ports when the free port
	// picked is taken by someone else before the postmaster binds it.
	portAttempts = 3
)

// errExited says the postmaster exited while starting (for example, its
// port was taken in the meantime): starting again on another port may work.
var errExited = errors.New("postgres exited during startup")

// Shutdown is a PostgreSQL shutdown mode.
type Shutdown string

const (
	// Fast (SIGINT) rolls back open transactions, disconnects the clients
	// and writes a checkpoint.
	Fast Shutdown = "fast"
	// Immediate (SIGQUIT) stops at once without a checkpoint, as a crash
	// would: the next start runs crash recovery.
	Immediate Shutdown = "immediate"
)

// Options configures Start.
type Options struct {
	// Name names the server in its directory's name and in errors
	// ("postgres" if empty).
	Name string
	// Template, if not nil, is copied as the server's data directory
	// instead of running initdb, which is much faster.
	Template *Template
	// SSL, if not nil, turns SSL on (ssl=on) with this certificate and
	// key, so that clients can connect with sslmode=verify-full. The files
	// are copied into the server's directory (the key with mode 0600,
	// owned by the user the server runs as, as PostgreSQL requires).
	// Clients may still connect without SSL (DSN's sslmode=disable).
	SSL *SSLFiles
	// FakeTime, if set, runs the server under libfaketime (LD_PRELOAD) with
	// a control file in the server's directory, so a test can step the
	// database host's wall clock while the server runs (SetClockOffset).
	// Only the wall clock (CLOCK_REALTIME: now(), clock_timestamp()) is
	// faked, as a clock step on a real host would; the monotonic clock is
	// left alone. Start fails if libfaketime is not installed (Debian:
	// apt-get install libfaketime).
	FakeTime bool
}

// SSLFiles name the PEM files of Options.SSL.
type SSLFiles struct {
	CertFile, KeyFile string
}

// Server is a running PostgreSQL server. Its methods are safe for
// concurrent use.
type Server struct {
	name string
	loc  local
	dir  string // the server's own directory: data/, the unix socket, postgres.log
	port int
	ssl  bool // server.crt and server.key in dir, served with ssl=on
	// faketime is the libfaketime library the server runs under
	// (Options.FakeTime), "" for none; its control file is in dir.
	faketime string

	mu      sync.Mutex // serialises Restart and Stop
	pm      *postmaster
	stopped bool
	stopErr error
}

// postmaster is one run of the server process.
type postmaster struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process has exited
	err    error         // cmd.Wait's result; read only after exited is closed
}

// Start creates the server's directory, initialises its data directory
// (initdb, or a copy of opts.Template) and starts the server on a free
// 127.0.0.1 port. It returns once the server accepts connections.
func Start(ctx context.Context, opts Options) (srv *Server, err error) {
	name := cmp.Or(opts.Name, "postgres")
	var loc local
	var parent string // "": the system temp directory
	if opts.Template != nil {
		loc, parent = opts.Template.loc, opts.Template.root
	} else if loc, err = findLocal(); err != nil {
		return nil, err
	}
	dir, err := makeDir(parent, "lockd-pg-"+name+"-*", loc.cred)
	if err != nil {
		return nil, fmt.Errorf("pgserver: %s: %w", name, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	data := filepath.Join(dir, "data")
	if opts.Template != nil {
		// cp -a keeps the owner and the 0700 mode PostgreSQL insists on.
		if out, err := exec.CommandContext(ctx, "cp", "-a", opts.Template.data, data).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("pgserver: %s: copy template: %w\n%s", name, err, out)
		}
	} else if err := initdb(ctx, loc, data); err != nil {
		return nil, fmt.Errorf("pgserver: %s: %w", name, err)
	}
	s := &Server{name: name, loc: loc, dir: dir}
	if opts.FakeTime {
		if s.faketime, err = findFakeTime(); err != nil {
			return nil, fmt.Errorf("pgserver: %s: %w", name, err)
		}
		if err := s.SetClockOffset(0); err != nil {
			return nil, err
		}
	}
	if opts.SSL != nil {
		if err := s.installSSL(*opts.SSL); err != nil {
			return nil, fmt.Errorf("pgserver: %s: %w", name, err)
		}
	}
	for attempt := 1; ; attempt++ {
		if s.port, err = loopback.FreePort(); err != nil {
			return nil, fmt.Errorf("pgserver: %s: %w", name, err)
		}
		err = s.launch(ctx)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errExited) || attempt == portAttempts {
			return nil, err
		}
	}
}

// DSN returns a superuser DSN for database on the server, over TCP on
// 127.0.0.1.
func (s *Server) DSN(database string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", s.Addr(), database)
}

// VerifyFullDSN returns a superuser DSN for database on a server started
// with Options.SSL: over TCP on 127.0.0.1 with sslmode=verify-full, which
// verifies the server's certificate against the PEM CA bundle caFile and
// its name (the certificate must hold the IP address 127.0.0.1).
func (s *Server) VerifyFullDSN(database, caFile string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=verify-full&sslrootcert=%s",
		s.Addr(), database, url.QueryEscape(caFile))
}

// Addr returns the server's TCP address, 127.0.0.1:PORT. It stays the same
// across Restart.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// CreateDatabase creates a database on the server.
func (s *Server) CreateDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: %s: create database %s: %w", s.name, name, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("pgserver: %s: create database %s: %w", s.name, name, err)
	}
	return nil
}

// Restart shuts the server down in mode, waits for it to exit and starts it
// again on the same port and data directory. It fails, without starting
// the server again, if the server had exited on its own.
func (s *Server) Restart(ctx context.Context, mode Shutdown) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return fmt.Errorf("pgserver: %s: restart after Stop", s.name)
	}
	if err := s.shutdown(mode); err != nil {
		return err
	}
	return s.launch(ctx)
}

// Stop shuts the server down (fast), waits for it to exit and removes its
// directory. It reports an error if the server had exited on its own (with
// the end of its log) or had to be killed. It is idempotent; after it the
// server's DSN refuses connections.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopped {
		s.stopped = true
		s.stopErr = errors.Join(s.shutdown(Fast), os.RemoveAll(s.dir))
	}
	return s.stopErr
}

// launch starts the postmaster on s.port and waits until it accepts
// connections. s.mu is held, or s is not shared yet.
func (s *Server) launch(ctx context.Context) error {
	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgserver: %s: %w", s.name, err)
	}
	defer logf.Close() // the child has its own copy
	args := []string{"-D", filepath.Join(s.dir, "data"),
		"-p", strconv.Itoa(s.port), "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=on", "-c", "max_connections=300"}
	if s.ssl {
		args = append(args, "-c", "ssl=on",
			"-c", "ssl_cert_file="+filepath.Join(s.dir, sslCertName), "-c", "ssl_key_file="+filepath.Join(s.dir, sslKeyName))
	}
	cmd := exec.Command(filepath.Join(s.loc.bin, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = env()
	if s.faketime != "" {
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+s.faketime, "FAKETIME_TIMESTAMP_FILE="+s.fakeTimeFile(),
			"FAKETIME_NO_CACHE=1", "FAKETIME_DONT_FAKE_MONOTONIC=1")
	}
	cmd.Dir = s.dir // our working directory may be unreadable for nobody
	// If our process dies without stopping the server, the kernel sends the
	// postmaster SIGQUIT (immediate shutdown). Go sets this after switching
	// credentials, so the credential change does not clear it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.loc.cred, Pdeathsig: syscall.SIGQUIT}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgserver: %s: start postgres: %w", s.name, err)
	}
	pm := &postmaster{cmd: cmd, exited: make(chan struct{})}
	s.pm = pm
	// This goroutine ends when the postmaster exits; Stop makes it exit.
	go func() {
		pm.err = cmd.Wait()
		close(pm.exited)
	}()
	if err := s.waitReady(ctx, pm); err != nil {
		_ = cmd.Process.Kill()
		<-pm.exited
		return fmt.Errorf("pgserver: %s on port %d: %w\n%s", s.name, s.port, err, tail(s.logPath()))
	}
	return nil
}

// waitReady polls a connection until the server answers, it exits, ctx
// ends or readyTimeout passes.
func (s *Server) waitReady(ctx context.Context, pm *postmaster) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(cctx, s.DSN("postgres"))
		if err == nil {
			err = conn.Ping(cctx)
			_ = conn.Close(cctx)
		}
		ccancel()
		if err == nil {
			return nil
		}
		select {
		case <-pm.exited:
			return fmt.Errorf("%w: %v", errExited, pm.err)
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w (last attempt: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// shutdown stops the postmaster in mode and waits for it to exit, killing
// it after stopTimeout. s.mu is held.
func (s *Server) shutdown(mode Shutdown) error {
	pm := s.pm
	select {
	case <-pm.exited:
		return fmt.Errorf("pgserver: %s exited: %v\n%s", s.name, pm.err, tail(s.logPath()))
	default:
	}
	sig := syscall.SIGINT
	if mode == Immediate {
		sig = syscall.SIGQUIT
	}
	_ = pm.cmd.Process.Signal(sig)
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-pm.exited:
		return nil
	case <-t.C:
		_ = pm.cmd.Process.Kill()
		<-pm.exited
		return fmt.Errorf("pgserver: %s: no exit within %v of a %s shutdown; killed it", s.name, stopTimeout, mode)
	}
}

// Names of the SSL files inside the server's directory.
const (
	sslCertName = "server.crt"
	sslKeyName  = "server.key"
)

// installSSL copies the certificate and key into the server's directory,
// owned by the user the server runs as; the key with mode 0600.
func (s *Server) installSSL(files SSLFiles) error {
	for _, f := range []struct {
		src, name string
		mode      os.FileMode
	}{{files.CertFile, sslCertName, 0o644}, {files.KeyFile, sslKeyName, 0o600}} {
		b, err := os.ReadFile(f.src)
		if err != nil {
			return fmt.Errorf("ssl: %w", err)
		}
		dst := filepath.Join(s.dir, f.name)
		if err := os.WriteFile(dst, b, f.mode); err != nil {
			return fmt.Errorf("ssl: %w", err)
		}
		if s.loc.cred != nil {
			if err := os.Chown(dst, int(s.loc.cred.Uid), int(s.loc.cred.Gid)); err != nil {
				return fmt.Errorf("ssl: %w", err)
			}
		}
	}
	s.ssl = true
	return nil
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "postgres.log") }
