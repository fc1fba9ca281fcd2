package backend

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// DefaultDataDir is the default of lock.embedded.data-dir (C5
// #ct5-data-dir): a path that does not depend on the working directory, so
// that starting lockd from elsewhere never silently opens a fresh, empty
// backend. The first of: $STATE_DIRECTORY (systemd StateDirectory=),
// $XDG_STATE_HOME/lockd, /var/lib/lockd for root, ~/.local/state/lockd.
func DefaultDataDir() string {
	return defaultDataDir(os.Getenv, os.Geteuid(), os.UserHomeDir)
}

func defaultDataDir(getenv func(string) string, euid int, home func() (string, error)) string {
	if d, _, _ := strings.Cut(getenv("STATE_DIRECTORY"), ":"); d != "" {
		return d
	}
	if d := getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "lockd")
	}
	if euid == 0 {
		return "/var/lib/lockd"
	}
	if h, err := home(); err == nil && h != "" {
		return filepath.Join(h, ".local", "state", "lockd")
	}
	return "/var/lib/lockd"
}

// prepareDataDir makes dir absolute (a relative lock.embedded.data-dir is
// resolved once, at start) and reports whether it holds no data yet (it
// does not exist or is empty), for the start's log line.
func prepareDataDir(dir string) (abs string, fresh bool, err error) {
	abs, err = filepath.Abs(dir)
	if err != nil {
		return "", false, err
	}
	entries, err := os.ReadDir(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return abs, true, nil
	case err != nil:
		return "", false, err
	}
	return abs, len(entries) == 0, nil
}
