package worker

import (
	"time"

	"lock.dev/lockd/client"
)

// scaledClock is an SDK clock whose rate is scale times real time: 2 runs
// twice as fast, 0.5 half as fast. Its readings carry the monotonic clock
// (they are derived from base with Add).
type scaledClock struct {
	base  time.Time
	scale float64
}

var _ client.Clock = (*scaledClock)(nil)

func newScaledClock(scale float64) *scaledClock {
	return &scaledClock{base: time.Now(), scale: scale}
}

// Now returns the scaled time.
func (c *scaledClock) Now() time.Time {
	return c.base.Add(time.Duration(float64(time.Since(c.base)) * c.scale))
}

// AfterFunc calls f once d has passed on the scaled clock.
func (c *scaledClock) AfterFunc(d time.Duration, f func()) client.Timer {
	return time.AfterFunc(time.Duration(float64(d)/c.scale), f)
}

// real converts a reading of the scaled clock into real time.
func (c *scaledClock) real(t time.Time) time.Time {
	return c.base.Add(time.Duration(float64(t.Sub(c.base)) / c.scale))
}
