package bench

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Readings of a process from Linux /proc.

// userHZ is the unit of the CPU times in /proc/<pid>/stat (USER_HZ, 100 on
// every Linux architecture).
const userHZ = 100

// procCPU returns the CPU time process pid has used: the sum over its
// threads of /proc/<pid>/task/<tid>/schedstat (nanoseconds; the time of
// threads that already exited is missing, which Go's threads rarely do), or
// where that is not available, utime+stime from /proc/<pid>/stat (clock
// ticks of 10 ms).
func procCPU(pid int) (time.Duration, error) {
	if d, err := procSchedCPU(pid); err == nil {
		return d, nil
	}
	return procStatCPU(pid)
}

func procSchedCPU(pid int) (time.Duration, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/schedstat")
		if errors.Is(err, os.ErrNotExist) {
			continue // the thread exited meanwhile
		}
		if err != nil {
			return 0, err
		}
		f := strings.Fields(string(b))
		if len(f) < 1 {
			return 0, fmt.Errorf("unexpected %s/%s/schedstat: %q", dir, t.Name(), b)
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unexpected %s/%s/schedstat: %q", dir, t.Name(), b)
		}
		total += time.Duration(ns)
	}
	return total, nil
}

func procStatCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("read cpu time (needs Linux /proc): %w", err)
	}
	// The command name (field 2) may contain spaces; the fields after it
	// start with the state (field 3). utime and stime are fields 14 and 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat: %q", pid, s)
	}
	var ticks int64
	for _, v := range f[11:13] {
		t, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unexpected /proc/%d/stat: %q", pid, s)
		}
		ticks += t
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// procRSS returns the resident set size of process pid and its peak, in
// MiB.
func procRSS(pid int) (rss, peak Value, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, fmt.Errorf("read memory use (needs Linux /proc): %w", err)
	}
	found := 0
	for line := range strings.Lines(string(b)) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, 0, fmt.Errorf("unexpected /proc/%d/status line %q", pid, line)
		}
		kb, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, 0, fmt.Errorf("unexpected /proc/%d/status line %q", pid, line)
		}
		if name == "VmRSS" {
			rss = Value(kb / 1024)
		} else {
			peak = Value(kb / 1024)
		}
		found++
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("no VmRSS/VmHWM in /proc/%d/status", pid)
	}
	return rss, peak, nil
}
