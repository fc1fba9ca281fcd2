package sdk_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tsPackageCheck is the TypeScript file tsPackaging type-checks against the
// installed package: its entry point's classes and types, and a lock's
// token.
const tsPackageCheck = `import { Client, Session, Lock, Leadership, type ClientOptions, type AcquireOptions } from "@lockd/client";

export function client(opts: ClientOptions): Client {
  return new Client("127.0.0.1:7070,127.0.0.1:7071", opts);
}

export async function token(c: Client, o: AcquireOptions): Promise<bigint> {
  const s: Session = await c.newSession();
  const l: Lock = await s.acquire("k", o);
  return l.token;
}

export type L = Leadership;
`

// tsPackaging is the TypeScript counterpart of sdk/python's
// tests/test_packaging.py (issue 25, "npm pack / npm install work on a clean
// machine"): npm pack of the package npm ci built in dir, npm install of the
// tarball into a new project with no network (the dependencies' tarballs
// come from the npm cache npm ci filled: the project's lockfile is the
// package's own, its development dependencies left out, because npm
// install --offline cannot resolve versions without the registry's
// metadata, which npm ci does not cache), then an import of the package by
// node from that project and tsc --noEmit (the package's own tsc) of a file
// that uses its declarations. It fails when the package's "files" or
// "exports" miss the built output, or when the tarball carries the tests'
// build (dist/test: the agents and workers are not in the package).
func tsPackaging(t *testing.T, ctx context.Context, dir string) {
	proj := t.TempDir()
	out := tsRun(t, ctx, dir, nil, "npm", "pack", "--ignore-scripts", "--json", "--pack-destination", proj)
	var packed []struct {
		Filename string `json:"filename"`
		Files    []struct {
			Path string `json:"path"`
		} `json:"files"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &packed); err != nil || len(packed) != 1 {
		t.Fatalf("npm pack --json: %v (%d packages)\n%s", err, len(packed), out)
	}
	for _, f := range packed[0].Files {
		if strings.HasPrefix(f.Path, "dist/test/") || strings.HasPrefix(f.Path, "test/") {
			t.Errorf("the tarball carries %s: the tests' build is not part of the package", f.Path)
		}
	}
	var pkg struct {
		Name         string            `json:"name"`
		Version      string            `json:"version"`
		License      string            `json:"license"`
		Dependencies map[string]string `json:"dependencies"`
		Engines      map[string]string `json:"engines"`
	}
	var lock struct {
		Packages map[string]map[string]any `json:"packages"`
	}
	readJSON(t, filepath.Join(dir, "package.json"), &pkg)
	readJSON(t, filepath.Join(dir, "package-lock.json"), &lock)
	spec := "file:" + packed[0].Filename
	const name = "lockd-pack-check"
	pkgs := map[string]any{
		"":                         map[string]any{"name": name, "version": "0.0.0", "dependencies": map[string]string{pkg.Name: spec}},
		"node_modules/" + pkg.Name: map[string]any{"version": pkg.Version, "resolved": spec, "license": pkg.License, "dependencies": pkg.Dependencies, "engines": pkg.Engines},
	}
	for k, v := range lock.Packages {
		if dev, _ := v["dev"].(bool); strings.HasPrefix(k, "node_modules/") && !dev {
			pkgs[k] = v
		}
	}
	writeJSON(t, filepath.Join(proj, "package.json"), map[string]any{"name": name, "version": "0.0.0", "private": true,
		"type": "module", "dependencies": map[string]string{pkg.Name: spec}})
	writeJSON(t, filepath.Join(proj, "package-lock.json"), map[string]any{"name": name, "version": "0.0.0",
		"lockfileVersion": 3, "requires": true, "packages": pkgs})
	tsRun(t, ctx, proj, nil, "npm", "install", "--offline", "--no-audit", "--no-fund")

	imported := tsRun(t, ctx, proj, nil, "node", "--input-type=module", "-e",
		`import * as m from "@lockd/client";
const where = import.meta.resolve("@lockd/client");
for (const n of ["Client", "Session", "Lock", "Leadership"]) if (typeof m[n] !== "function") throw new Error(n + " not exported");
console.log("imported " + where);`)
	if !strings.Contains(imported, filepath.Join(proj, "node_modules", "@lockd", "client")) {
		t.Errorf("node imported the package from elsewhere than the new project's node_modules:\n%s", imported)
	}
	if err := os.WriteFile(filepath.Join(proj, "check.ts"), []byte(tsPackageCheck), 0o644); err != nil {
		t.Fatal(err)
	}
	// The SDK's own @types/node (a development dependency), as an
	// application would install it.
	writeJSON(t, filepath.Join(proj, "tsconfig.json"), map[string]any{"compilerOptions": map[string]any{
		"noEmit": true, "strict": true, "module": "nodenext", "moduleResolution": "nodenext", "target": "es2022",
		"types": []string{"node"}, "typeRoots": []string{filepath.Join(dir, "node_modules", "@types")},
	}, "files": []string{"check.ts"}})
	tsRun(t, ctx, proj, nil, filepath.Join(dir, "node_modules", ".bin", "tsc"), "-p", "tsconfig.json")
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, v)
	}
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", " ")
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	if err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}
