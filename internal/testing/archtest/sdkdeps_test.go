package archtest

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// sdkModulePackages are the only lockd packages a program that imports the
// SDK links: the SDK, the generated API, the wire-error vocabulary and the
// wire limits (key rules and bounds, standard library only).
var sdkModulePackages = []string{
	"lock.dev/lockd/client",
	"lock.dev/lockd/proto/lockd/v1",
	"lock.dev/lockd/proto/lockd/v1/wireerr",
	"lock.dev/lockd/proto/lockd/v1/wirelimits",
}

// sdkForbidden are import paths that must never reach an SDK user's binary,
// with everything below them: the metrics stack, the backends' drivers, and
// lockd's server side, the storage SPI and the backends included (issue 22:
// the SDK takes its key rules and bounds from the wire's own package).
var sdkForbidden = []string{
	"github.com/prometheus",
	"go.etcd.io",
	"github.com/jackc",
	"github.com/grpc-ecosystem/grpc-gateway", // the HTTP/JSON gateway is the server's (proto/lockd/v1/gateway)
	"lock.dev/lockd/server",
	"lock.dev/lockd/store", // and store/etcdstore, store/pgstore
	"lock.dev/lockd/internal",
	// OpenTelemetry's API (otel, otel/trace, otel/propagation) may be
	// linked: client.WithTracerProvider takes the application's provider
	// (C4 #ct4-traces). Its SDK, exporters and contrib instrumentation
	// are the application's choice, never the SDK's (issue 27).
	"go.opentelemetry.io/otel/sdk",
	"go.opentelemetry.io/otel/exporters",
	"go.opentelemetry.io/contrib",
}

// TestSDKImportGraph pins the SDK's import graph (issues 10 and 22): `go
// list -deps ./client` names no Prometheus, etcd, pgx or lockd server,
// store, backend or internal package, and no lockd package beyond
// sdkModulePackages.
func TestSDKImportGraph(t *testing.T) {
	deps := goListDeps(t, "./client")
	if !slices.Contains(deps, "lock.dev/lockd/client") {
		t.Fatalf("go list -deps ./client does not list the client itself: %v", deps)
	}
	for _, dep := range deps {
		if i := slices.IndexFunc(sdkForbidden, func(bad string) bool {
			return dep == bad || strings.HasPrefix(dep, bad+"/")
		}); i >= 0 {
			t.Errorf("the SDK links %s (nothing under %s may be linked)", dep, sdkForbidden[i])
			continue
		}
		if strings.HasPrefix(dep, "lock.dev/lockd/") && !slices.Contains(sdkModulePackages, dep) {
			t.Errorf("the SDK links lockd package %s; allowed are %v", dep, sdkModulePackages)
		}
	}
}

// goListDeps runs `go list -deps pkg` at the module root with the go command
// of the toolchain that runs the test.
func goListDeps(t *testing.T, pkg string) []string {
	t.Helper()
	goBin := goCommand(t)
	cmd := exec.Command(goBin, "list", "-deps", pkg)
	cmd.Dir = moduleRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s list -deps %s: %v\n%s", goBin, pkg, err, stderrOf(err))
	}
	return strings.Fields(string(out))
}

// goCommand finds the go command on PATH and returns the one of the GOROOT
// it reports (the toolchain GOTOOLCHAIN selected).
func goCommand(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go command not on PATH: %v", err)
	}
	out, err := exec.Command(goBin, "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("%s env GOROOT: %v\n%s", goBin, err, stderrOf(err))
	}
	root := strings.TrimSpace(string(out))
	if root == "" {
		return goBin
	}
	return filepath.Join(root, "bin", "go")
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

// TestShippedImportGraph pins what ships (issue 22: tooling apart from
// product): `go list -deps ./cmd/lockd` names no test kit (nothing under
// lock.dev/lockd/internal/testing) and nothing under lock.dev/lockd/test.
func TestShippedImportGraph(t *testing.T) {
	deps := goListDeps(t, "./cmd/lockd")
	if !slices.Contains(deps, "lock.dev/lockd/server") {
		t.Fatalf("go list -deps ./cmd/lockd does not list the server: %v", deps)
	}
	for _, dep := range deps {
		for _, bad := range []string{"lock.dev/lockd/internal/testing", "lock.dev/lockd/test", "lock.dev/lockd/store/storetest"} {
			if dep == bad || strings.HasPrefix(dep, bad+"/") {
				t.Errorf("the lockd binary links %s (test tooling)", dep)
			}
		}
	}
}
