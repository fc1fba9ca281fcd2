//go:build lockd_deadlock_off_control

package deadlock

// This file exists only in a build with the tag lockd_deadlock_off_control:
// the deadlock-off control of the chaos suite (test/chaos, control
// deadlock-off). It breaks C2 #ct2-deadlock on purpose: the detector still
// scans, but never refuses a wait, so a cycle of waiting sessions waits
// until the callers give up. The chaos checker "every waiter in a cycle
// failed or was granted within the bound" (check.DeadlocksResolved) must
// catch it. Never in a release build.
const controlOff = true
