package testkit

import (
	"flag"
	"fmt"
	"strconv"
)

// parallelFlag is the testing package's -parallel flag as the test binary
// sees it (go test passes -parallel N on as -test.parallel=N).
const parallelFlag = "test.parallel"

// DefaultParallel makes n the package's -parallel (how many parallel tests
// run at once; the testing package's default is GOMAXPROCS, 2 on the CI
// machine) unless the command line set it: an explicit `go test -parallel
// N` still wins. For packages whose parallel tests mostly wait (child
// processes, TTLs, polls) rather than compute: each says why in its
// TestMain (docs/reliability.md "CI time"). Call it from TestMain before
// m.Run; it parses the command line if TestMain has not.
func DefaultParallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	if err := defaultParallel(flag.CommandLine, n); err != nil {
		panic(err) // a TestMain's own mistake (n < 1, no testing flags)
	}
}

// defaultParallel sets fs's -test.parallel to n unless it was set.
func defaultParallel(fs *flag.FlagSet, n int) error {
	if n < 1 {
		return fmt.Errorf("testkit.DefaultParallel(%d): want at least 1", n)
	}
	if fs.Lookup(parallelFlag) == nil {
		return fmt.Errorf("testkit.DefaultParallel: no -%s flag (not a test binary?)", parallelFlag)
	}
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == parallelFlag })
	if set {
		return nil
	}
	return fs.Set(parallelFlag, strconv.Itoa(n))
}
