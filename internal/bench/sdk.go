package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The SDK rows (issue 25): lockd's distinct scenario measured through the
// SDKs of other languages, each cell in a worker process of that SDK (the
// Python SDK's lockd._benchworker, the TypeScript SDK's
// dist/test/benchworker.js), beside the same cell through the Go SDK
// ("go-sdk": a `lockd bench worker` child, or this process with
// --in-process), alternating round by round; each figure is reported as a
// ratio to the Go SDK's of the same run. An SDK worker speaks the Go
// worker's protocol: a workerJob as JSON on stdin, a workerResult on stdout.

// sysGoSDK names the Go SDK's cells of the SDK rows (lockd's system
// measured again beside the other SDKs).
const sysGoSDK = "go-sdk"

// DefaultSDKConcurrency are the client counts of the SDK rows.
var DefaultSDKConcurrency = []int{1, 64}

// SDKWorker is an SDK the SDK rows measure lockd through: Command (argv)
// runs its bench worker, with Env added to the bench's environment.
type SDKWorker struct {
	Name    string
	Command []string
	Env     []string
}

// Names of the SDK workers PythonSDK and TypeScriptSDK make.
const (
	SDKPython     = "python"
	SDKTypeScript = "typescript"
)

// PythonSDK is the Python SDK in dir (the sdk/python directory of a lockd
// checkout: the package lockd) run by the interpreter python, which needs
// Debian's python3-grpcio and python3-protobuf.
func PythonSDK(dir, python string) (SDKWorker, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return SDKWorker{}, fmt.Errorf("python sdk: %w", err)
	}
	if _, err := os.Stat(filepath.Join(abs, "lockd", "_benchworker.py")); err != nil {
		return SDKWorker{}, fmt.Errorf("python sdk: %s is not sdk/python of a lockd checkout: %w", dir, err)
	}
	return SDKWorker{Name: SDKPython, Command: []string{python, "-m", "lockd._benchworker"},
		Env: []string{"PYTHONPATH=" + abs, "PYTHONDONTWRITEBYTECODE=1"}}, nil
}

// TypeScriptSDK is the TypeScript SDK in dir (sdk/typescript of a lockd
// checkout after `npm ci`, which compiles it into dist) run by node.
func TypeScriptSDK(dir, node string) (SDKWorker, error) {
	js, err := filepath.Abs(filepath.Join(dir, "dist", "test", "benchworker.js"))
	if err != nil {
		return SDKWorker{}, fmt.Errorf("typescript sdk: %w", err)
	}
	if _, err := os.Stat(js); err != nil {
		return SDKWorker{}, fmt.Errorf("typescript sdk: %s has no dist/test/benchworker.js (run npm ci there first): %w", dir, err)
	}
	return SDKWorker{Name: SDKTypeScript, Command: []string{node, js}}, nil
}

// validateSDKs checks the SDK settings of c (after defaults).
func (c Config) validateSDKs() []error {
	var errs []error
	if len(c.SDKs) > 0 && !slices.Contains(c.Scenarios, scDistinct) {
		errs = append(errs, errors.New("the SDK rows are measured with the distinct scenario: add it to the scenarios"))
	}
	seen := map[string]bool{sysGoSDK: true}
	for _, s := range c.SDKs {
		if s.Name == "" || seen[s.Name] || len(s.Command) == 0 {
			errs = append(errs, fmt.Errorf("sdk %q: want a unique name other than %s and a command", s.Name, sysGoSDK))
		}
		seen[s.Name] = true
	}
	for _, n := range c.SDKConcurrency {
		if n < 1 || n > 10000 {
			errs = append(errs, fmt.Errorf("sdk concurrency %d out of [1, 10000]", n))
		}
	}
	return errs
}

// sdkNote explains the SDK rows.
const sdkNote = "sdk rows (scenario distinct, SDK named): lockd's distinct load through another SDK, its clients in a worker process of " +
	"that SDK, against the same load through the Go SDK (go-sdk) in the same rounds; LOCKD is the SDK's figure, RAW the Go SDK's, " +
	"LOCKD/RAW their ratio (pairs/s below 1, latencies and client cpu above 1: the SDK's overhead); client cpu = the clients' " +
	"process inside the window (not with --in-process)"

// sdkRows measures the distinct load through the Go SDK and every SDK of
// the configuration at each SDK concurrency, and returns their rows.
func (r *runner) sdkRows(ctx context.Context) ([]Row, error) {
	lockd := r.bed.systems[0]
	var rows []Row
	for _, c := range r.cfg.SDKConcurrency {
		entries := []entry{{sysGoSDK, func(ctx context.Context, round int) (loadResult, string, error) {
			tag := fmt.Sprintf("sdk-go-c%d-r%d", c, round)
			lr, err := r.cell(ctx, scDistinct, lockd, c, tag, func(ctx context.Context) (loadResult, error) {
				return measure(ctx, lockd, c, r.cfg.Duration, tag, distinctLoad)
			})
			return lr, pairsSummary(lr), err
		}}}
		for _, sdk := range r.cfg.SDKs {
			entries = append(entries, entry{sdk.Name, func(ctx context.Context, round int) (loadResult, string, error) {
				lr, err := r.sdkCell(ctx, sdk, c, fmt.Sprintf("sdk-%s-c%d-r%d", sdk.Name, c, round))
				return lr, pairsSummary(lr), err
			}})
		}
		res, err := r.rounds(ctx, fmt.Sprintf("sdk distinct c=%d", c), entries)
		if err != nil {
			return nil, err
		}
		goRates, goLat := rates(res[sysGoSDK]), sortedLatencies(res[sysGoSDK])
		for _, sdk := range r.cfg.SDKs {
			sdkRates, sdkLat := rates(res[sdk.Name]), sortedLatencies(res[sdk.Name])
			pairs := compare(scDistinct, c, MetricPairsPerSec, sysGoSDK, median(sdkRates), median(goRates))
			pairs.LockdRounds, pairs.RawRounds = sdkRates, goRates
			p50 := compare(scDistinct, c, MetricP50, sysGoSDK, percentile(sdkLat, 50), percentile(goLat, 50))
			p99 := compare(scDistinct, c, MetricP99, sysGoSDK, percentile(sdkLat, 99), percentile(goLat, 99))
			for _, row := range []*Row{&pairs, &p50, &p99} {
				row.SDK, row.Note = sdk.Name, sdkNote
			}
			rows = append(rows, pairs, p50, p99)
			// The clients' CPU per pair, when the Go SDK's cells ran in
			// worker processes too (not with --in-process).
			if goCPU, sdkCPU := cpusPerOp(res[sysGoSDK], roleClient), cpusPerOp(res[sdk.Name], roleClient); metered(goCPU) && metered(sdkCPU) {
				row := compare(scDistinct, c, MetricClientCPUPerOp, sysGoSDK, median(sdkCPU), median(goCPU))
				row.LockdRounds, row.RawRounds, row.SDK, row.Note = sdkCPU, goCPU, sdk.Name, sdkNote
				rows = append(rows, row)
			}
		}
	}
	return rows, nil
}

// metered reports whether every round has a CPU figure.
func metered(vs []Value) bool {
	return len(vs) > 0 && !slices.ContainsFunc(vs, func(v Value) bool { return math.IsNaN(float64(v)) })
}

func pairsSummary(lr loadResult) string {
	lat := sortedLatencies([]loadResult{lr})
	return fmt.Sprintf("%s pairs/s  p50 %s ms  p99 %s ms", lr.rate(), percentile(lat, 50), percentile(lat, 99))
}

// sdkCell measures one cell of the distinct load through sdk's worker, and
// refuses it if the backend committed nothing meanwhile (checkWork).
func (r *runner) sdkCell(ctx context.Context, sdk SDKWorker, c int, tag string) (loadResult, error) {
	name := sdk.Name + " sdk"
	before, err := r.bed.commitPosition(ctx)
	if err != nil {
		return loadResult{}, err
	}
	job := workerJob{System: sysLockd, Scenario: scDistinct, C: c, Duration: r.cfg.Duration, Tag: tag, LockdAddr: r.bed.lockdAddr}
	lr, _, err := runJob(ctx, sdk.Command, sdk.Env, job)
	if err != nil {
		return loadResult{}, fmt.Errorf("%s: %w", name, err)
	}
	after, err := r.bed.commitPosition(ctx)
	if err != nil {
		return loadResult{}, err
	}
	if err := checkWork(name, lr, before, after); err != nil {
		return loadResult{}, err
	}
	return lr, nil
}

// sdkLegend explains the SDK rows' names in the table.
var sdkLegend = []string{
	"go-sdk          sdk rows: lockd through the Go SDK, the same cells as the SDKs' (a `lockd bench worker` child unless in one process)",
	"python,typescript  sdk rows: lockd through that SDK (sdk/python, sdk/typescript), its clients in a worker process of its own " +
		"(" + strings.Join([]string{"python3 -m lockd._benchworker", "node dist/test/benchworker.js"}, ", ") + ")",
}
