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
	tsDir  string // the built copy of sdk/typescript, removed by removeBuildDir
	tsErr  error
)

// buildTypeScriptSDK builds a copy of sdk/typescript once per test binary
// (npm ci, whose prepare script runs tsc). TestParityTypeScript calls it
// before its rows start, so the build (seconds) is not charged to whichever
// row's subtest happens to start the first agent.
func buildTypeScriptSDK(t *testing.T) {
	t.Helper()
	tsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lockd-parity-ts-")
		if err != nil {
			tsErr = err
			return
		}
		tsDir = dir
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
				tsErr = err
				return
			}
		}
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--prefer-offline")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			tsErr = &exec.Error{Name: "npm ci: " + string(out), Err: err}
		}
	})
	if tsErr != nil {
		t.Fatalf("build sdk/typescript: %v", tsErr)
	}
}

// startTypeScriptAgent starts the TypeScript SDK's agent (node
// dist/test/agent.js of the copy buildTypeScriptSDK built); it quits when t
// ends.
func startTypeScriptAgent(t *testing.T) *agent {
	t.Helper()
	buildTypeScriptSDK(t)
	return startAgent(t, exec.Command("node", filepath.Join(tsDir, "dist", "test", "agent.js")))
}
