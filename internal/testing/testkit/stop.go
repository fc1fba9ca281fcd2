package testkit

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Stop sends SIGSTOP to p and returns once every one of its threads is
// stopped, failing t if p is gone or a thread still runs after within.
// kill(2) returns once the signal is queued, not once the process stopped:
// the kernel wakes one thread, which then stops the others, and until each
// is scheduled it goes on running. On a loaded machine, or in a throttled
// CPU cgroup, that lasts long enough for a replica to read what another
// process committed after the kill and answer it (issue 21: a replica sent a
// watch event for a release made after kill returned; the last thread of a
// replica stopped 4 ms to 0.4 s after it returned, under the helpers' cap).
// What the test does next must not depend on that race.
func Stop(t testing.TB, p *os.Process, within time.Duration) {
	t.Helper()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP process %d: %v", p.Pid, err)
	}
	Eventually(t, within, fmt.Sprintf("every thread of process %d stopped after SIGSTOP", p.Pid), func() error {
		stopped, gone := ThreadsStopped(p.Pid)
		switch {
		case gone:
			t.Fatalf("process %d is gone (exited instead of stopping)", p.Pid)
		case !stopped:
			return fmt.Errorf("a thread of process %d still runs", p.Pid)
		}
		return nil
	})
}

// ThreadsStopped reports whether every thread of process pid is stopped
// (state T or t in /proc/PID/task/TID/stat), or whether the process is
// gone (no such process, or a zombie).
func ThreadsStopped(pid int) (stopped, gone bool) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false, true
	}
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if err != nil {
			continue // the thread exited meanwhile
		}
		// The state follows the command name, which is in parentheses
		// and may itself contain any character.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) {
			return false, false
		}
		switch b[i+2] {
		case 'T', 't':
		case 'Z', 'X':
			return false, true
		default:
			return false, false
		}
	}
	return true, false
}
