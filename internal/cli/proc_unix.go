//go:build unix

package cli

import (
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// setProcessGroup makes cmd the leader of a new process group, so the whole
// group can be signalled. When stdin is the controlling terminal and lockd is
// in the foreground, the new group becomes the terminal's foreground group
// (the command can read the terminal, and Ctrl-C reaches it directly); the
// returned function gives the terminal back to lockd's group once the command
// has exited. It must be called exactly once.
func setProcessGroup(cmd *exec.Cmd, stdin io.Reader) (restore func()) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	f, ok := stdin.(*os.File)
	if !ok || !isTerminalFile(f) {
		return func() {}
	}
	fd := int(f.Fd())
	fg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP)
	if err != nil || fg != unix.Getpgrp() {
		return func() {} // lockd itself runs in the background
	}
	cmd.SysProcAttr.Foreground = true
	cmd.SysProcAttr.Ctty = fd
	return func() {
		// A background group writing the terminal's foreground group gets
		// SIGTTOU unless it ignores it.
		signal.Ignore(syscall.SIGTTOU)
		defer signal.Reset(syscall.SIGTTOU)
		_ = unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, unix.Getpgrp())
	}
}

// signalGroup sends sig to the process group pgid.
func signalGroup(pgid int, sig syscall.Signal) error {
	return syscall.Kill(-pgid, sig)
}
