package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// Exit codes of lockd (see the package doc).
const (
	ExitOK       = 0
	ExitError    = 1
	ExitUsage    = 2
	ExitLockLost = 75 // EX_TEMPFAIL: the lock was lost; retrying later may work
)

// Run runs the lockd command line (args without the program name) and returns
// the process exit code. ctx ends a running command: main cancels it on
// SIGINT/SIGTERM. Output goes to stdout and stderr only.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return run(ctx, args, &env{stdin: stdin, stdout: stdout, stderr: stderr, environ: os.Environ})
}

// env is what a command may touch of its process: the standard streams and
// the environment. Tests pass their own.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	environ        func() []string
}

// getenv returns the value of the environment variable name, or "".
func (e *env) getenv(name string) string {
	for _, kv := range e.environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v
		}
	}
	return ""
}

// exitError ends a command with a given exit code. A nil err prints nothing.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// usageErrorf reports a usage error (exit code 2).
func usageErrorf(format string, args ...any) error {
	return &exitError{code: ExitUsage, err: fmt.Errorf(format, args...)}
}

func run(ctx context.Context, args []string, e *env) int {
	root := newRoot(e)
	root.SetArgs(args)
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	code := ExitError
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
		err = ee.err
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "%s: %v\n", cmd.CommandPath(), err)
		if code == ExitUsage {
			fmt.Fprintf(e.stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
	}
	return code
}

func newRoot(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "lockd",
		Short: "lockd is a distributed lock service with sessions, FIFO waiting and fencing tokens",
		Long: `lockd is a distributed lock service: sessions with a TTL, named locks with
fencing tokens, FIFO waiting, backends etcd (embedded by default) and PostgreSQL.

Start a server with 'lockd serve'; take a lock around a command with
'lockd run KEY -- CMD'.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("unknown command %q", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cmd.SetOut(e.stderr)
			_ = cmd.Help()
			return &exitError{code: ExitUsage}
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &exitError{code: ExitUsage, err: err}
	})
	root.AddCommand(newServeCmd(e), newRunCmd(e), newInspectCmd(e), newLsCmd(e), newRevokeCmd(e), newWatchCmd(e), newTopCmd(e), newSessionsCmd(e), newCheckCmd(e))
	root.AddCommand(newElectCmd(e), newLeaderCmd(e))
	root.AddCommand(newBenchCmd(e), newAuthCmd(e))
	root.AddCommand(newVersionCmd(e), newHealthCmd(e))
	return root
}

// exactArgs is cobra.ExactArgs reporting a usage error.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usageErrorf("want %s, got %d arguments", what, len(args))
		}
		return nil
	}
}

// maxArgs is cobra.MaximumNArgs reporting a usage error.
func maxArgs(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) > n {
			return usageErrorf("want %s, got %d arguments", what, len(args))
		}
		return nil
	}
}
