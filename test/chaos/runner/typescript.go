package runner

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// TypeScriptSDK: the TypeScript worker, `node dist/test/chaosworker.js`
// of a copy of sdk/typescript built once per Env (Binaries.TypeScriptSrc,
// Binaries.TypeScriptBuild). It speaks the Go worker's protocol (flags,
// state lines, -hold-ack, history file); under RecvTimeSDK it runs with the
// SDK's built-in receive-time control (LOCKD_TSSDK_CONTROL=recvtime).
const TypeScriptSDK SDK = "typescript"

// NodeEnv names the node the TypeScript workers run on (default "node"
// on PATH).
const NodeEnv = "LOCKD_CHAOS_NODE"

// typescriptBuildTimeout bounds npm ci (the locked dependencies, from the
// npm cache when it has them) and its prepare script, the one tsc.
const typescriptBuildTimeout = 5 * time.Minute

// typescriptBinaries fills in node, the SDK's directory under the module
// root and where the built copy of it goes (under dir, built on first use).
func typescriptBinaries(root, dir string, b *Binaries) {
	b.Node = "node"
	if p := os.Getenv(NodeEnv); p != "" {
		b.Node = p
	}
	b.TypeScriptSrc = filepath.Join(root, "sdk", "typescript")
	b.TypeScriptBuild = filepath.Join(dir, "typescript")
}

// typescriptBuilt builds the copy of the TypeScript SDK once per Env: the
// package's files copied, then npm ci, whose prepare script compiles src
// and test (test/chaosworker.ts among them) into dist.
func (e *Env) typescriptBuilt() error {
	e.tsOnce.Do(func() {
		src, dst := e.bins.TypeScriptSrc, e.bins.TypeScriptBuild
		if src == "" || dst == "" {
			e.tsErr = fmt.Errorf("typescript worker: no SDK directory (runner.Build sets it)")
			return
		}
		for _, name := range []string{"package.json", "package-lock.json", "tsconfig.json", "README.md", "src", "test"} {
			if err := copyPath(filepath.Join(src, name), filepath.Join(dst, name)); err != nil {
				e.tsErr = fmt.Errorf("typescript worker: copy %s: %w", name, err)
				return
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), typescriptBuildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--prefer-offline")
		cmd.Dir = dst
		cmd.Env = append(os.Environ(), "npm_config_update_notifier=false")
		if out, err := cmd.CombinedOutput(); err != nil {
			e.tsErr = fmt.Errorf("typescript worker: npm ci in %s: %w\n%s", dst, err, out)
			return
		}
		if _, err := os.Stat(filepath.Join(dst, "dist", "test", "chaosworker.js")); err != nil {
			e.tsErr = fmt.Errorf("typescript worker: npm ci did not build it (prepare: tsc): %w", err)
		}
	})
	return e.tsErr
}

// copyPath copies a file or a directory tree.
func copyPath(from, to string) error {
	fi, err := os.Stat(from)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return os.CopyFS(to, os.DirFS(from))
	}
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}

// typescriptCommand turns a worker's flags into the TypeScript worker's
// command line.
func (r *run) typescriptCommand(args []string) (bin string, argv []string) {
	return r.env.bins.Node, append([]string{filepath.Join(r.env.bins.TypeScriptBuild, "dist", "test", "chaosworker.js")}, args...)
}

// TypeScriptSuite returns the scenarios of issue 25 for the TypeScript SDK:
// the pause-holder, SIGKILL-holder, long-partition and replica-kill faults
// on etcd and PostgreSQL with TypeScript workers, and the receive-time
// control built into the TypeScript SDK (caught like
// control-recvtime-sdk-pg). They run by `make chaos-typescript`
// (LOCKD_CHAOS_SUITE=typescript), not in the short suite of `make test`.
func TypeScriptSuite() []Spec { return sdkSuite("ts", TypeScriptSDK) }
