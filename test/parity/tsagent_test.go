package parity

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	tsOnce sync.Once
	tsDone chan struct{} // closed when the build ended; nil until startTypeScriptBuild
	tsDir  string        // the built copy of sdk/typescript, removed by removeBuildDir
	tsErr  error         // valid once tsDone is closed
)

// startTypeScriptBuild starts building a copy of sdk/typescript (npm ci,
// whose prepare script runs tsc) once per test binary and returns at once;
// buildTypeScriptSDK waits for it. TestParityTypeScript and
// TestAgentSessionOutlivesStall start it first thing, so that it runs beside
// lockd's build (build) rather than after it. Neither waits for it in its
// body: a parallel test's body holds one of the package's slots
// (rowsAtOnce) and its rows queue for theirs only once it returns, so a
// body that waited for the build (20-30 s under load) put every TypeScript
// row behind all the others' (the package's last 50 s were those rows);
// and a build started by the first agent, after lockd's, kept the
// TypeScript rows' slots waiting for it. The goroutine ends with npm;
// removeBuildDir waits for it.
func startTypeScriptBuild() {
	tsOnce.Do(func() {
		tsDone = make(chan struct{})
		go func() { // ends when npm ci has (every agent start waits for it)
			defer close(tsDone)
			tsDir, tsErr = buildTypeScriptCopy()
		}()
	})
}

// buildTypeScriptSDK waits for the build startTypeScriptBuild started
// (starting it if no test did) and fails t if it failed. The first
// scenario of a TypeScript row that starts before the build ended waits
// here, before its agent starts; the scenarios' own bounds count from
// after.
func buildTypeScriptSDK(t *testing.T) {
	t.Helper()
	startTypeScriptBuild()
	<-tsDone
	if tsErr != nil {
		t.Fatalf("build sdk/typescript: %v", tsErr)
	}
}

// buildTypeScriptCopy copies sdk/typescript's sources into a new temporary
// directory and runs npm ci there; it returns the directory (also on
// failure, for removeBuildDir).
func buildTypeScriptCopy() (string, error) {
	dir, err := os.MkdirTemp("", "lockd-parity-ts-")
	if err != nil {
		return "", err
	}
	src := filepath.Join("..", "..", "sdk", "typescript")
	for _, name := range []string{"package.json", "package-lock.json", "tsconfig.json", "README.md", "src", "test"} {
		from, to := filepath.Join(src, name), filepath.Join(dir, name)
		fi, err := os.Stat(from)
		if err == nil && fi.IsDir() {
			err = os.CopyFS(to, os.DirFS(from))
		} else if err == nil {
			var b []byte
			if b, err = os.ReadFile(from); err == nil {
				err = os.WriteFile(to, b, 0o644)
			}
		}
		if err != nil {
			return dir, err
		}
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--prefer-offline")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return dir, &exec.Error{Name: "npm ci: " + string(out), Err: err}
	}
	return dir, nil
}

// startTypeScriptAgent starts the TypeScript SDK's agent (node
// dist/test/agent.js of the copy buildTypeScriptSDK built); it quits when t
// ends.
func startTypeScriptAgent(t *testing.T) *agent {
	t.Helper()
	buildTypeScriptSDK(t)
	return startAgent(t, exec.Command("node", filepath.Join(tsDir, "dist", "test", "agent.js")))
}
