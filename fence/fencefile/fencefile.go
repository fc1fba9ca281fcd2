//go:build unix

package fencefile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"lock.dev/lockd/fence"
)

// MarkSuffix is appended to a file's path to name its sidecar mark file.
const MarkSuffix = ".fence"

// ErrOtherKey: the file's mark belongs to another key (tokens of different
// keys are not comparable). It matches fence.ErrInvalid.
var ErrOtherKey = fmt.Errorf("%w: the file is fenced by another key", fence.ErrInvalid)

// Writer writes fenced files and counts refusals.
type Writer struct {
	// Metrics, if set, counts refused writes (resource "file").
	Metrics *fence.Metrics
}

// Write is Writer{}.Write.
func Write(path, key string, token uint64, data []byte) error {
	return Writer{}.Write(path, key, token, data)
}

// Write replaces path's contents with data (mode 0o600 for a new file,
// kept for an existing one) if token is at or above the file's mark for
// key; a lower token is a *fence.StaleError and leaves the file as it was.
func (w Writer) Write(path, key string, token uint64, data []byte) error {
	if err := fence.Validate(key, token); err != nil {
		return err
	}
	if strings.ContainsAny(key, "\n") {
		return fmt.Errorf("%w: key contains a newline", fence.ErrInvalid)
	}
	mf, err := os.OpenFile(path+MarkSuffix, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("fencefile: %w", err)
	}
	defer mf.Close()
	if err := syscall.Flock(int(mf.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("fencefile: lock %s: %w", mf.Name(), err)
	}
	defer func() { _ = syscall.Flock(int(mf.Fd()), syscall.LOCK_UN) }() // closing unlocks too
	markKey, high, err := readMark(mf)
	if err != nil {
		return err
	}
	if high > 0 && markKey != key {
		return fmt.Errorf("fencefile: %s: %w (%q)", path, ErrOtherKey, markKey)
	}
	if token < high {
		w.Metrics.Refused(fence.ResourceFile)
		return &fence.StaleError{Key: key, Token: token, HighWater: high}
	}
	if token > high {
		if err := writeMark(mf, key, token); err != nil {
			return err
		}
	}
	return replace(path, data)
}

// readMark reads "key\ntoken\n"; an empty file is no mark.
func readMark(f *os.File) (string, uint64, error) {
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<20))
	if err != nil {
		return "", 0, fmt.Errorf("fencefile: read mark: %w", err)
	}
	if len(b) == 0 {
		return "", 0, nil
	}
	key, tok, ok := strings.Cut(strings.TrimSuffix(string(b), "\n"), "\n")
	t, perr := strconv.ParseUint(tok, 10, 64)
	if !ok || perr != nil {
		return "", 0, fmt.Errorf("fencefile: %s is not a mark file", f.Name())
	}
	return key, t, nil
}

func writeMark(f *os.File, key string, token uint64) error {
	b := []byte(key + "\n" + strconv.FormatUint(token, 10) + "\n")
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("fencefile: write mark: %w", err)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		return fmt.Errorf("fencefile: write mark: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fencefile: sync mark: %w", err)
	}
	return nil
}

// replace writes data to a temporary file beside path, syncs it and
// renames it over path.
func replace(path string, data []byte) error {
	mode := os.FileMode(0o600)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("fencefile: %w", err)
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return errors.Join(fmt.Errorf("fencefile: write %s: %w", path, err), os.Remove(tmp.Name()))
	}
	return nil
}
