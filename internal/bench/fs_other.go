//go:build !linux

package bench

import "os"

// fsType names the filesystem dir is on: not known off Linux.
func fsType(string) string { return "unknown (not Linux)" }

// fdatasync flushes f; off Linux with fsync.
func fdatasync(f *os.File) error { return f.Sync() }
