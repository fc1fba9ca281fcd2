package runner

import (
	"os"
	"path/filepath"
)

// SDK names the SDK a scenario's workers run on (issue 25: chaos with
// workers in each language).
type SDK string

// SDKs.
const (
	// GoSDK: the Go worker (test/chaos/cmd/chaos-worker), the default.
	GoSDK SDK = ""
	// PythonSDK: the Python worker, `python3 -m lockd._chaosworker` on
	// the SDK in sdk/python (Binaries.Python, Binaries.PythonPath). It
	// speaks the Go worker's protocol (flags, state lines, -hold-ack,
	// history file); under RecvTimeSDK it runs with the SDK's built-in
	// receive-time control (LOCKD_PYSDK_CONTROL=recvtime).
	PythonSDK SDK = "python"
)

// PythonEnv names the Python interpreter the Python workers run on
// (default defaultPython: Debian's, with python3-grpcio and
// python3-protobuf).
const PythonEnv = "LOCKD_CHAOS_PYTHON"

const defaultPython = "/usr/bin/python3"

// pythonBinaries fills in the Python worker's interpreter and the SDK's
// directory under the module root.
func pythonBinaries(root string, b *Binaries) {
	b.Python = defaultPython
	if p := os.Getenv(PythonEnv); p != "" {
		b.Python = p
	}
	b.PythonPath = filepath.Join(root, "sdk", "python")
}

// pythonCommand turns a worker's flags into the Python worker's command
// line and the environment it needs besides the Go worker's.
func (r *run) pythonCommand(args []string) (bin string, argv, env []string) {
	argv = append([]string{"-m", "lockd._chaosworker"}, args...)
	return r.env.bins.Python, argv, []string{"PYTHONPATH=" + r.env.bins.PythonPath, "PYTHONDONTWRITEBYTECODE=1"}
}

// PythonSuite returns the scenarios of issue 25 for the Python SDK: the
// pause-holder, SIGKILL-holder, long-partition and replica-kill faults on
// etcd and PostgreSQL with Python workers, and the receive-time control
// built into the Python SDK (caught like control-recvtime-sdk-pg). They
// run by `make chaos-python` (LOCKD_CHAOS_SUITE=python), not in the short
// suite of `make test`.
func PythonSuite() []Spec { return sdkSuite("py", PythonSDK) }

// sdkSuite is the scenarios an SDK's workers run (PythonSuite,
// TypeScriptSuite): names prefixed with prefix, the control named
// control-recvtime-sdk-<prefix>-pg.
func sdkSuite(prefix string, sdk SDK) []Spec {
	return []Spec{
		{Name: prefix + "-pause-embedded", Backend: Embedded, Fault: PauseHolder, SDK: sdk},
		{Name: prefix + "-pause-pg", Backend: PG, Fault: PauseHolder, SDK: sdk},
		{Name: prefix + "-kill-holder-embedded", Backend: Embedded, Fault: KillHolder, SDK: sdk},
		{Name: prefix + "-kill-holder-pg", Backend: PG, Fault: KillHolder, SDK: sdk},
		{Name: prefix + "-partition-long-etcd", Backend: Etcd, Fault: PartitionLong, Cycles: 1, SDK: sdk},
		{Name: prefix + "-partition-long-pg", Backend: PG, Fault: PartitionLong, Cycles: 1, SDK: sdk},
		{Name: prefix + "-replica-kill-etcd", Backend: Etcd, Fault: ReplicaKill, Cycles: 3, TTL: replicaTTL, SDK: sdk},
		{Name: prefix + "-replica-kill-pg", Backend: PG, Fault: ReplicaKill, Cycles: 3, TTL: replicaTTL, SDK: sdk},
		{Name: "control-recvtime-sdk-" + prefix + "-pg", Backend: PG, Fault: FarHolder, Control: RecvTimeSDK, SDK: sdk},
	}
}
