package soak

import (
	"fmt"
	"slices"
)

// Series is one measured quantity over a run, sampled at even intervals.
type Series struct {
	Name    string
	Samples []float64
	// Tolerance is the allowed growth of the last third's maximum over the
	// middle third's, as a fraction of the latter; Slack is allowed on top,
	// in the series' unit (noise around small values).
	Tolerance, Slack float64
}

// Flat reports an error when s grows: the maximum of its last third is
// above the maximum of its middle third by more than Tolerance × that
// maximum + Slack. The first third is warm-up. At least 6 samples are
// needed.
func Flat(s Series) error {
	n := len(s.Samples)
	if n < 6 {
		return fmt.Errorf("%s: %d samples, need at least 6", s.Name, n)
	}
	mid := slices.Max(s.Samples[n/3 : 2*n/3])
	last := slices.Max(s.Samples[2*n/3:])
	if limit := mid*(1+s.Tolerance) + s.Slack; last > limit {
		return fmt.Errorf("%s grows: max %.0f over the last third, %.0f over the middle third (limit %.0f)", s.Name, last, mid, limit)
	}
	return nil
}
