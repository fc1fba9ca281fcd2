package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgReadyTimeout bounds a PostgreSQL start (crash recovery included).
const pgReadyTimeout = 60 * time.Second

// pgEnv runs PostgreSQL servers from the local binaries, each a copy of one
// initdb'd template: internal/pgtest starts servers too, but cannot restart
// one on its port and data, which the restart scenarios need.
type pgEnv struct {
	bin      string
	cred     *syscall.Credential // nil: run as ourselves
	root     string              // servers' directories; removed by close
	template string              // initdb'd data directory
}

// preparePG finds the binaries and initdb's the template.
func preparePG() (*pgEnv, error) {
	bin, err := pgBinDir()
	if err != nil {
		return nil, err
	}
	e := &pgEnv{bin: bin}
	if os.Geteuid() == 0 { // PostgreSQL refuses to run as root
		u, err := user.Lookup("nobody")
		if err != nil {
			return nil, fmt.Errorf("postgresql: running as root needs user nobody: %w", err)
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("postgresql: user nobody: %w", err)
		}
		e.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
	}
	// /tmp: every parent must be searchable by the server's user.
	e.root, err = os.MkdirTemp("/tmp", "lockd-chaos-pg-*")
	if err != nil {
		return nil, fmt.Errorf("postgresql: %w", err)
	}
	if err := e.own(e.root); err != nil {
		_ = os.RemoveAll(e.root)
		return nil, err
	}
	if err := os.Chmod(e.root, 0o755); err != nil {
		_ = os.RemoveAll(e.root)
		return nil, fmt.Errorf("postgresql: %w", err)
	}
	e.template = filepath.Join(e.root, "template")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", e.template, "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.Dir = e.root
	initdb.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: e.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		_ = os.RemoveAll(e.root)
		return nil, fmt.Errorf("postgresql: initdb: %w\n%s", err, out)
	}
	return e, nil
}

func (e *pgEnv) own(path string) error {
	if e.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(e.cred.Uid), int(e.cred.Gid)); err != nil {
		return fmt.Errorf("postgresql: %w", err)
	}
	return nil
}

// close removes every server's directory (the servers must be stopped).
func (e *pgEnv) close() error { return os.RemoveAll(e.root) }

// pgBinDir finds initdb and postgres: PATH, then the highest-versioned
// /usr/lib/postgresql/*/bin.
func pgBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	var dirs []string
	for _, m := range matches {
		if _, err := os.Stat(filepath.Join(filepath.Dir(m), "initdb")); err == nil {
			dirs = append(dirs, filepath.Dir(m))
		}
	}
	if len(dirs) == 0 {
		return "", errors.New("postgresql: no initdb and postgres on PATH or in /usr/lib/postgresql/*/bin " +
			"(apt-get install postgresql)")
	}
	version := func(d string) int { v, _ := strconv.Atoi(filepath.Base(filepath.Dir(d))); return v }
	slices.SortFunc(dirs, func(a, b string) int { return version(a) - version(b) })
	return dirs[len(dirs)-1], nil
}

// pgServer is one PostgreSQL server, restartable on its port and data.
type pgServer struct {
	env  *pgEnv
	name string
	dir  string
	port int

	mu    sync.Mutex
	p     *process
	start int
}

// newServer copies the template and starts a server on it.
func (e *pgEnv) newServer(name string) (*pgServer, error) {
	dir, err := os.MkdirTemp(e.root, name+"-*")
	if err != nil {
		return nil, fmt.Errorf("postgresql: %w", err)
	}
	if err := errors.Join(e.own(dir), os.Chmod(dir, 0o755)); err != nil {
		return nil, err
	}
	// cp -a keeps the owner and the 0700 mode PostgreSQL insists on.
	if out, err := exec.Command("cp", "-a", e.template, filepath.Join(dir, "data")).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("postgresql: copy template: %w\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("postgresql: %w", err)
	}
	s := &pgServer{env: e, name: name, dir: dir, port: port}
	if err := s.launch(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *pgServer) launch() error {
	s.mu.Lock()
	s.start++
	n := s.start
	s.mu.Unlock()
	args := []string{"-D", filepath.Join(s.dir, "data"), "-p", strconv.Itoa(s.port), "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=on", "-c", "max_connections=300"}
	p, err := startProcess(fmt.Sprintf("%s.%d", s.name, n), filepath.Join(s.env.bin, "postgres"), args,
		[]string{"LC_ALL=C", "TZ=UTC"}, s.env.cred, filepath.Join(s.dir, "postgres.log"), nil)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.p = p
	s.mu.Unlock()
	deadline := time.Now().Add(pgReadyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.dsn("postgres"))
		if err == nil {
			err = conn.Ping(ctx)
			_ = conn.Close(ctx)
		}
		cancel()
		switch {
		case err == nil:
			return nil
		case p.done():
			return p.failure()
		case time.Now().After(deadline):
			p.kill()
			return fmt.Errorf("%s not ready after %v: %w", p.name, pgReadyTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dsn returns a superuser DSN of database on the server's port.
func (s *pgServer) dsn(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, database)
}

// addr returns the server's TCP address.
func (s *pgServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

func (s *pgServer) proc() *process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p
}

// createDB creates a database.
func (s *pgServer) createDB(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.dsn("postgres"))
	if err != nil {
		return fmt.Errorf("postgresql: create database %s: %w", name, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("postgresql: create database %s: %w", name, err)
	}
	return nil
}

// pgStopMode is a PostgreSQL shutdown mode.
type pgStopMode string

const (
	pgFast      pgStopMode = "fast"      // SIGINT: roll back, disconnect, checkpoint
	pgImmediate pgStopMode = "immediate" // SIGQUIT: no checkpoint; crash recovery at the next start
)

// shutdown stops the server in mode and waits for it to exit.
func (s *pgServer) shutdown(mode pgStopMode) error {
	p := s.proc()
	if p.done() {
		return p.failure()
	}
	sig := syscall.SIGINT
	if mode == pgImmediate {
		sig = syscall.SIGQUIT
	}
	p.signal(sig)
	t := time.NewTimer(60 * time.Second)
	defer t.Stop()
	select {
	case <-p.exited:
		return nil
	case <-t.C:
		p.kill()
		return fmt.Errorf("%s: no exit within 60s of a %s shutdown; killed it", p.name, mode)
	}
}

// restart shuts the server down in mode and starts it again on the same
// port and data.
func (s *pgServer) restart(mode pgStopMode) error {
	if err := s.shutdown(mode); err != nil {
		return err
	}
	return s.launch()
}

// stop shuts the server down (fast).
func (s *pgServer) stop() error { return s.shutdown(pgFast) }
