//go:build !race

package parity

// raceEnabled: the test binary has no race detector, so neither has lockd.
const raceEnabled = false
