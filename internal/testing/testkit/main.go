package testkit

import (
	"fmt"
	"os"

	"go.uber.org/goleak"
)

// Runner is what a TestMain runs: *testing.M, or a wrapper of it that starts
// and stops shared servers around the run.
type Runner interface{ Run() int }

// Main runs m, then calls each of after (stopping shared servers), then,
// if the run passed, fails it when goroutines leaked (goleak, with opts). It
// does not return. Every package's TestMain calls it, directly or through
// lockdtest.Main.
func Main(m Runner, after []func(), opts ...goleak.Option) {
	code := m.Run()
	for _, f := range after {
		f()
	}
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
