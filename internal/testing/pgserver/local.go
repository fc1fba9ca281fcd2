package pgserver

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
	"strings"
	"syscall"

	"lock.dev/lockd/internal/testing/testkit"
)

// ErrNoBinaries is returned when initdb and postgres are not found.
var ErrNoBinaries = errors.New("pgserver: no PostgreSQL server binaries (initdb, postgres) on PATH or in " +
	"/usr/lib/postgresql/*/bin (apt-get install postgresql)")

// local is where the binaries are and whom the servers run as.
type local struct {
	bin  string              // directory holding initdb and postgres
	cred *syscall.Credential // nil: run as ourselves
}

func findLocal() (local, error) {
	bin, err := findBinDir()
	if err != nil {
		return local{}, err
	}
	cred, err := credential()
	if err != nil {
		return local{}, err
	}
	return local{bin: bin, cred: cred}, nil
}

// Template is an initialised data directory that Start copies (see
// Options.Template) instead of running initdb for every server. Servers
// started from it keep their directories inside the template's.
type Template struct {
	loc  local
	root string // the template's directory; the servers' directories are inside
	data string // the initdb'd data directory
}

// NewTemplate runs initdb once into a fresh directory.
func NewTemplate(ctx context.Context) (*Template, error) {
	loc, err := findLocal()
	if err != nil {
		return nil, err
	}
	root, err := makeDir("", "lockd-pg-template-*", loc.cred)
	if err != nil {
		return nil, fmt.Errorf("pgserver: template: %w", err)
	}
	t := &Template{loc: loc, root: root, data: filepath.Join(root, "template")}
	if err := initdb(ctx, loc, t.data); err != nil {
		_ = os.RemoveAll(root)
		return nil, fmt.Errorf("pgserver: template: %w", err)
	}
	return t, nil
}

// Close removes the template and the directories of the servers started
// from it, which must be stopped.
func (t *Template) Close() error { return os.RemoveAll(t.root) }

// initdb initialises data, with its output in initdb.log beside it.
// --no-sync only skips flushing initdb's own files; the servers run with
// fsync on.
func initdb(ctx context.Context, loc local, data string) error {
	dir := filepath.Dir(data)
	logPath := filepath.Join(dir, "initdb.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, filepath.Join(loc.bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = env()
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: loc.cred}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, tail(logPath))
	}
	return nil
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
		return "", ErrNoBinaries
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
		return nil, fmt.Errorf("pgserver: running as root, and PostgreSQL refuses to run as root, "+
			"but there is no user \"nobody\" to run it as: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgserver: user nobody: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// makeDir creates a directory in parent, owned by the user PostgreSQL runs
// as. An empty parent means the system temp directory; when PostgreSQL runs
// as another user every parent must be searchable by others, which
// t.TempDir's 0700 parents are not, so /tmp is used if TMPDIR points
// somewhere private.
func makeDir(parent, pattern string, cred *syscall.Credential) (string, error) {
	if parent == "" {
		parent = os.TempDir()
		if cred != nil && !searchableByOthers(parent) {
			parent = "/tmp"
		}
	}
	dir, err := os.MkdirTemp(parent, pattern)
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

// env is the environment of PostgreSQL's programs: ours without PG*
// variables (which would redirect them), with a fixed locale and time zone.
func env() []string {
	return testkit.ChildEnv([]string{"PG", "LC_", "LANG=", "TZ="}, "LC_ALL=C", "TZ=UTC")
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
	return strings.TrimSpace(string(b))
}
