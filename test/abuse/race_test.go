//go:build race

package abuse

// raceEnabled: the test binary has the race detector, so lockd is built
// with it too.
const raceEnabled = true
