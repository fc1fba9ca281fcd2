package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"lock.dev/lockd/internal/testing/pgserver"
)

// Binaries are the programs a run starts, built once per suite.
type Binaries struct {
	Lockd  string // cmd/lockd
	Worker string // test/chaos/cmd/chaos-worker
	Etcd   string // test/cmd/etcd
	// WorkerRecvTime is the worker built with the SDK's receive-time
	// control (build tag lockd_recvtime_control): the recvtime-sdk control.
	WorkerRecvTime string
	// LockdStale is lockd built with the server's stale-record control
	// (build tag lockd_stale_control): the stale-record control.
	LockdStale string
	// LockdDeadlockOff is lockd built with the deadlock detector's control
	// (build tag lockd_deadlock_off_control): the deadlock-off control.
	LockdDeadlockOff string
	// Python is the interpreter of the Python workers and PythonPath the
	// directory of the Python SDK (SDK PythonSDK, python.go).
	Python, PythonPath string
	// Node runs the TypeScript workers; TypeScriptSrc is the TypeScript
	// SDK's directory and TypeScriptBuild where a copy of it is built on
	// first use (SDK TypeScriptSDK, typescript.go).
	Node, TypeScriptSrc, TypeScriptBuild string
}

// Build builds lockd, the worker and the etcd member into dir with the go
// command (go build -o dir), from the module that contains the working
// directory, and the control builds the scenarios of specs break (with
// their breaks on): the worker once more with the SDK's receive-time
// control (dir/recvtime), lockd once more with the server's stale-record
// control (dir/stale) and once with the deadlock detector's control
// (dir/deadlockoff). A control build left out leaves its field empty.
// race adds -race.
func Build(ctx context.Context, dir string, race bool, specs []Spec) (Binaries, error) {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return Binaries{}, fmt.Errorf("build: go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	if root == "." || root == "" {
		return Binaries{}, errors.New("build: not inside the lockd module")
	}
	build := func(tag, out string, pkgs ...string) error {
		args := []string{"build", "-o", out}
		if tag != "" {
			args = append(args, "-tags", tag)
		}
		if race {
			args = append(args, "-race")
		}
		cmd := exec.CommandContext(ctx, "go", append(args, pkgs...)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build: go %s: %w\n%s", strings.Join(cmd.Args[1:], " "), err, out)
		}
		return nil
	}
	if err := build("", dir+string(filepath.Separator), "./cmd/lockd", "./test/chaos/cmd/chaos-worker", "./test/cmd/etcd"); err != nil {
		return Binaries{}, err
	}
	b := Binaries{
		Lockd:  filepath.Join(dir, "lockd"),
		Worker: filepath.Join(dir, "chaos-worker"),
		Etcd:   filepath.Join(dir, "etcd"),
	}
	controls := []struct {
		c             Control
		tag, sub, pkg string
		bin           *string
	}{
		{RecvTimeSDK, "lockd_recvtime_control", "recvtime", "./test/chaos/cmd/chaos-worker", &b.WorkerRecvTime},
		{StaleRecord, "lockd_stale_control", "stale", "./cmd/lockd", &b.LockdStale},
		{DeadlockOff, "lockd_deadlock_off_control", "deadlockoff", "./cmd/lockd", &b.LockdDeadlockOff},
	}
	for _, c := range controls {
		if !slices.ContainsFunc(specs, func(s Spec) bool { return s.breaks(c.c) }) {
			continue
		}
		*c.bin = filepath.Join(dir, c.sub, filepath.Base(c.pkg))
		if err := build(c.tag, *c.bin, c.pkg); err != nil {
			return Binaries{}, err
		}
	}
	pythonBinaries(root, &b)
	typescriptBinaries(root, dir, &b)
	return b, nil
}

// Env is what the scenarios of one suite share: the binaries and, started
// on first use, PostgreSQL (a template data directory, and one server on
// which the scenarios that do not restart it get a database each). Its
// methods are safe for concurrent use.
type Env struct {
	bins Binaries

	pgOnce   sync.Once
	pg       *pgserver.Template
	pgShared *pgserver.Server
	pgErr    error

	mu  sync.Mutex
	dbs int

	tsOnce sync.Once // builds the TypeScript worker (typescriptBuilt)
	tsErr  error
}

// NewEnv returns an environment running bins.
func NewEnv(bins Binaries) *Env { return &Env{bins: bins} }

func (e *Env) pgStart() error {
	e.pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), pgStartTimeout)
		defer cancel()
		e.pg, e.pgErr = pgserver.NewTemplate(ctx)
		if e.pgErr != nil {
			return
		}
		e.pgShared, e.pgErr = pgserver.Start(ctx, pgserver.Options{Name: "shared", Template: e.pg})
	})
	return e.pgErr
}

// sharedDB creates a fresh database on the shared server and returns the
// server and the database name.
func (e *Env) sharedDB() (*pgserver.Server, string, error) {
	if err := e.pgStart(); err != nil {
		return nil, "", err
	}
	e.mu.Lock()
	e.dbs++
	name := fmt.Sprintf("chaos%d", e.dbs)
	e.mu.Unlock()
	if err := createDB(e.pgShared, name); err != nil {
		return nil, "", err
	}
	return e.pgShared, name, nil
}

// privatePG starts a server of the caller's own (stopped by the caller)
// with a database "chaos".
func (e *Env) privatePG(name string) (*pgserver.Server, string, error) {
	if err := e.pgStart(); err != nil {
		return nil, "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), pgStartTimeout)
	defer cancel()
	s, err := pgserver.Start(ctx, pgserver.Options{Name: name, Template: e.pg})
	if err != nil {
		return nil, "", err
	}
	if err := createDB(s, "chaos"); err != nil {
		return nil, "", errors.Join(err, s.Stop())
	}
	return s, "chaos", nil
}

// Close stops the shared PostgreSQL server and removes every server's
// files.
func (e *Env) Close() error {
	var errs []error
	if e.pgShared != nil {
		errs = append(errs, e.pgShared.Stop())
	}
	if e.pg != nil {
		errs = append(errs, e.pg.Close())
	}
	return errors.Join(errs...)
}

// pgStartTimeout bounds initdb and a PostgreSQL server's start (pgserver
// bounds the wait for readiness itself, crash recovery included).
const pgStartTimeout = 2 * time.Minute

// createDB creates a database on s.
func createDB(s *pgserver.Server, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return s.CreateDatabase(ctx, name)
}

// ensureDir creates dir.
func ensureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return nil
}
