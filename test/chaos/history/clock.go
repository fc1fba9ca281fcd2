package history

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// EpochEnv is the environment variable through which the harness passes the
// run's epoch to the processes it starts, formatted by FormatEpoch.
const EpochEnv = "LOCKD_CHAOS_EPOCH"

// FormatEpoch formats a run epoch for EpochEnv: Unix nanoseconds, decimal.
func FormatEpoch(epoch time.Time) string { return strconv.FormatInt(epoch.UnixNano(), 10) }

// ParseEpoch parses what FormatEpoch produced.
func ParseEpoch(s string) (time.Time, error) {
	ns, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("history: parse epoch %q: %w", s, err)
	}
	return time.Unix(0, ns), nil
}

// Clock converts this process's time into run time: nanoseconds since the run
// epoch (package doc, Time). It is safe for concurrent use.
type Clock struct {
	epoch  time.Time
	start  time.Time // with a monotonic reading
	offset int64     // start − epoch
}

// NewClock returns a clock for the run that started at epoch. If epoch
// carries a monotonic reading (it was taken by time.Now in this process, as
// in the harness), the offset is measured on the monotonic clock; otherwise
// (parsed from EpochEnv) it is measured once on the wall clock.
func NewClock(epoch time.Time) *Clock {
	start := time.Now()
	return &Clock{epoch: epoch, start: start, offset: int64(start.Sub(epoch))}
}

// ClockFromEnv returns NewClock of the epoch in EpochEnv.
func ClockFromEnv() (*Clock, error) {
	s, ok := os.LookupEnv(EpochEnv)
	if !ok {
		return nil, fmt.Errorf("history: clock from env: %s not set", EpochEnv)
	}
	epoch, err := ParseEpoch(s)
	if err != nil {
		return nil, err
	}
	return NewClock(epoch), nil
}

// Epoch returns the run's epoch.
func (c *Clock) Epoch() time.Time { return c.epoch }

// Now returns the current run time.
func (c *Clock) Now() int64 { return c.offset + int64(time.Since(c.start)) }

// At converts a time of this process into run time. t should carry a
// monotonic reading (time.Now, or a time derived from it with Add), so the
// conversion is monotonic; a time without one is converted by wall clock.
func (c *Clock) At(t time.Time) int64 { return c.offset + int64(t.Sub(c.start)) }
