package pgserver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// libfaketime (Options.FakeTime): the server's processes run with
// LD_PRELOAD=libfaketime.so.1 and FAKETIME_TIMESTAMP_FILE naming a control
// file that holds the clock offset ("+30s"); FAKETIME_NO_CACHE=1 makes every
// clock call read it, so SetClockOffset steps the server's wall clock at
// once, as an operator's `date -s` or an NTP step would on a real host.

// fakeTimeName is the control file's name in the server's directory.
const fakeTimeName = "faketime.rc"

// fakeTimeGlobs are where Debian and others install libfaketime.
var fakeTimeGlobs = []string{
	"/usr/lib/*/faketime/libfaketime.so.1",
	"/usr/lib/faketime/libfaketime.so.1",
	"/usr/local/lib/faketime/libfaketime.so.1",
}

// ErrNoFakeTime means libfaketime is not installed.
var ErrNoFakeTime = errors.New("libfaketime not found (Debian: apt-get install libfaketime)")

func findFakeTime() (string, error) {
	for _, g := range fakeTimeGlobs {
		if m, _ := filepath.Glob(g); len(m) > 0 {
			return m[0], nil
		}
	}
	return "", ErrNoFakeTime
}

func (s *Server) fakeTimeFile() string { return filepath.Join(s.dir, fakeTimeName) }

// SetClockOffset sets the server's wall clock to the real time plus d (a
// server started with Options.FakeTime). It takes effect at the server's
// next clock read: for a running transaction, now() stays its start time.
func (s *Server) SetClockOffset(d time.Duration) error {
	if s.faketime == "" {
		return fmt.Errorf("pgserver: %s: not started with FakeTime", s.name)
	}
	// libfaketime reads "+Ns" / "-Ns" as an offset from the real clock.
	spec := fmt.Sprintf("%+.3fs\n", d.Seconds())
	tmp := s.fakeTimeFile() + ".tmp"
	if err := os.WriteFile(tmp, []byte(spec), 0o644); err != nil {
		return fmt.Errorf("pgserver: %s: clock offset: %w", s.name, err)
	}
	if err := os.Rename(tmp, s.fakeTimeFile()); err != nil {
		return fmt.Errorf("pgserver: %s: clock offset: %w", s.name, err)
	}
	return nil
}
