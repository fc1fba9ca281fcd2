//go:build !lockd_deadlock_off_control

package deadlock

// controlOff is false: the detector refuses (control_off.go is the chaos
// suite's deadlock-off control).
const controlOff = false
