//go:build !unix

package cli

import (
	"io"
	"os"
	"os/exec"
	"syscall"
)

// setProcessGroup does nothing outside unix: the command runs in lockd's
// own process group.
func setProcessGroup(*exec.Cmd, io.Reader) (restore func()) { return func() {} }

// signalGroup signals only the command itself outside unix; SIGKILL kills
// it, other signals may not be supported.
func signalGroup(pid int, sig syscall.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	if sig == syscall.SIGKILL {
		return p.Kill()
	}
	return p.Signal(sig)
}
