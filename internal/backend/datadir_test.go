package backend

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestDefaultDataDir(t *testing.T) {
	home := func() (string, error) { return "/home/u", nil }
	noHome := func() (string, error) { return "", errors.New("no home") }
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	for _, tc := range []struct {
		name string
		env  map[string]string
		euid int
		home func() (string, error)
		want string
	}{
		{"systemd StateDirectory", map[string]string{"STATE_DIRECTORY": "/var/lib/lockd:/var/lib/other", "XDG_STATE_HOME": "/x"}, 0, home, "/var/lib/lockd"},
		{"XDG_STATE_HOME", map[string]string{"XDG_STATE_HOME": "/x/state"}, 1000, home, "/x/state/lockd"},
		{"root", nil, 0, home, "/var/lib/lockd"},
		{"user", nil, 1000, home, "/home/u/.local/state/lockd"},
		{"user without home", nil, 1000, noHome, "/var/lib/lockd"},
	} {
		if got := defaultDataDir(env(tc.env), tc.euid, tc.home); got != tc.want {
			t.Errorf("%s: defaultDataDir = %q; want %q", tc.name, got, tc.want)
		}
	}
	if d := DefaultConfig().EmbeddedDataDir; !filepath.IsAbs(d) {
		t.Errorf("DefaultConfig().EmbeddedDataDir = %q; want an absolute path (not relative to the working directory)", d)
	}
}

func TestPrepareDataDir(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	abs, fresh, err := prepareDataDir("data")
	if err != nil || abs != filepath.Join(dir, "data") || !fresh {
		t.Fatalf("prepareDataDir(relative, missing) = %q, %v, %v; want %q, fresh", abs, fresh, err, filepath.Join(dir, "data"))
	}
	if err := os.MkdirAll(filepath.Join(abs, "member"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, fresh, err := prepareDataDir(abs); err != nil || fresh {
		t.Fatalf("prepareDataDir(with data) fresh = %v, %v; want false", fresh, err)
	}
}
