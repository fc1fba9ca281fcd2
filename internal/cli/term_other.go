//go:build !linux

package cli

import (
	"io"
	"os"
)

// isTerminal reports whether w is a terminal; outside Linux lockd does not
// check and assumes it is not.
func isTerminal(io.Writer) bool { return false }

func isTerminalFile(*os.File) bool { return false }
