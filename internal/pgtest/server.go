package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/testkit"
)

// Server is a PostgreSQL server started by this package from the local
// binaries. Its methods are safe for concurrent use.
type Server struct {
	dir    string // temporary directory: data/, the unix socket, logs
	port   int
	cmd    *exec.Cmd
	exited chan struct{} // closed once the postmaster has exited

	stopOnce sync.Once
	stopErr  error
}

// NewServer starts a server of the test's own, separate from the shared
// one, and stops it when the test ends. It is for tests that need to stop or
// disturb a server; most tests want NewDatabase. It ignores
// LOCKD_TEST_PG_DSN: it always needs the local binaries.
func NewServer(t testing.TB) *Server {
	t.Helper()
	s, err := start()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("pgtest: stop server: %v", err)
		}
	})
	return s
}

// DSN returns a superuser DSN for the given database on s, over TCP on
// 127.0.0.1.
func (s *Server) DSN(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, database)
}

// Stop shuts the server down (fast shutdown: open transactions are rolled
// back, clients disconnected), waits for it to exit and removes its
// directory. It is idempotent; after it the server's DSN refuses
// connections.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		if s.cmd != nil {
			_ = s.cmd.Process.Signal(syscall.SIGINT) // fast shutdown
			select {
			case <-s.exited:
			case <-time.After(30 * time.Second):
				_ = s.cmd.Process.Kill()
				<-s.exited
				s.stopErr = errors.New("postgres did not stop within 30s; killed it")
			}
		}
		if err := os.RemoveAll(s.dir); err != nil && s.stopErr == nil {
			s.stopErr = err
		}
	})
	return s.stopErr
}

// errExited says the postmaster exited while starting (e.g. its port was
// taken in the meantime): starting again on another port may work.
var errExited = errors.New("postgres exited during startup")

// start initialises a data directory and starts a server on it.
func start() (srv *Server, err error) {
	bin, err := findBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := makeDir(cred)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	data := filepath.Join(dir, "data")
	// --no-sync only skips flushing initdb's own files; the server below
	// runs with fsync on.
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync")
	if err := run(initdb, cred, filepath.Join(dir, "initdb.log")); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, tail(filepath.Join(dir, "initdb.log")))
	}
	for attempt := 0; ; attempt++ {
		s := &Server{dir: dir}
		err := s.launch(bin, data, cred)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errExited) || attempt == 2 {
			return nil, err
		}
	}
}

// launch starts the postmaster on a free port and waits until it accepts
// connections.
func (s *Server) launch(bin, data string, cred *syscall.Credential) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	logPath := filepath.Join(s.dir, "postgres.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port), "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=on", "-c", "max_connections=300")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = pgEnv()
	cmd.Dir = s.dir // our working directory may be unreadable for nobody
	// If the test binary dies without stopping the server, the kernel sends
	// the postmaster SIGQUIT (immediate shutdown). Go sets this after
	// switching credentials, so the credential change does not clear it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	s.cmd, s.port, s.exited = cmd, port, make(chan struct{})
	// This goroutine ends when the postmaster exits; Stop makes it exit.
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	if err := s.waitReady(60 * time.Second); err != nil {
		_ = cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("%w\n%s", err, tail(logPath))
	}
	return nil
}

// waitReady polls a connection until the server answers, it exits, or the
// timeout passes.
func (s *Server) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return errExited
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err == nil {
			err = conn.Ping(ctx)
			_ = conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-s.exited:
			return errExited
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("postgres not ready after %v: %w", timeout, last)
}

// findBinDir finds the directory holding initdb and postgres: PATH first,
// then the highest-versioned /usr/lib/postgresql/*/bin.
func findBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	var dirs []string
	for _, m := range matches {
		dir := filepath.Dir(m)
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			dirs = append(dirs, dir)
		}
	}
	if len(dirs) == 0 {
		return "", fmt.Errorf("no PostgreSQL server binaries (initdb, postgres) on PATH or in /usr/lib/postgresql/*/bin: %s", installHint)
	}
	slices.SortFunc(dirs, func(a, b string) int { return compareVersions(versionOf(a), versionOf(b)) })
	return dirs[len(dirs)-1], nil
}

// versionOf extracts the version components of /usr/lib/postgresql/<v>/bin.
func versionOf(binDir string) []int {
	var v []int
	for _, f := range strings.Split(filepath.Base(filepath.Dir(binDir)), ".") {
		n, _ := strconv.Atoi(f)
		v = append(v, n)
	}
	return v
}

func compareVersions(a, b []int) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] - b[i]
		}
	}
	return len(a) - len(b)
}

// credential returns the user to run PostgreSQL as: nil (ourselves) unless
// we are root, which PostgreSQL refuses; then "nobody".
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL refuses to run as root, but there is no user \"nobody\" to run it as: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("user nobody: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// makeDir creates the server's directory, owned by the user PostgreSQL runs
// as. When that is another user, every parent must be searchable by others,
// which t.TempDir's 0700 parents are not: use the system temp directory, or
// /tmp if TMPDIR points somewhere private.
func makeDir(cred *syscall.Credential) (string, error) {
	base := os.TempDir()
	if cred != nil && !searchableByOthers(base) {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "lockd-pg-*")
	if err != nil {
		return "", err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

func searchableByOthers(dir string) bool {
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if p == filepath.Dir(p) {
			return true
		}
	}
}

// run runs cmd as cred with its output in logPath.
func run(cmd *exec.Cmd, cred *syscall.Credential, logPath string) error {
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = pgEnv()
	cmd.Dir = filepath.Dir(logPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	return cmd.Run()
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tail returns the end of a log file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// pgEnv is the environment of PostgreSQL's tools: ours without PG*
// variables (which would redirect them), with a fixed locale and time zone.
func pgEnv() []string {
	return testkit.ChildEnv([]string{"PG", "LC_", "LANG=", "TZ="}, "LC_ALL=C", "TZ=UTC")
}
