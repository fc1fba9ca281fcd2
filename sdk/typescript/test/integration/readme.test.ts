// The README's quickstart, run as written against the harness's lockd (only
// the import and the address are pointed at this build and that server).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { need } from "./env.js";

const root = resolve(fileURLToPath(import.meta.url), "../../../..");

/** Runs a README block as an ES module, pointed at this build and the harness's lockd; returns its stdout. */
async function runBlock(block: string): Promise<string> {
  const code = block
    .replace('"@lockd/client"', JSON.stringify(pathToFileURL(join(root, "dist/src/index.js")).href))
    .replace('"127.0.0.1:7420"', JSON.stringify(need("LOCKDTEST_ADDR")));
  const dir = mkdtempSync(join(tmpdir(), "lockd-quickstart-"));
  try {
    writeFileSync(join(dir, "quickstart.mjs"), code);
    return await new Promise<string>((res, rej) =>
      execFile(process.execPath, [join(dir, "quickstart.mjs")], { timeout: 20_000 }, (err, stdout, stderr) =>
        err ? rej(new Error(`${err.message}\n${stderr}`)) : res(stdout)));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test("the README quickstart runs", { timeout: 30_000 }, async () => {
  const readme = readFileSync(join(root, "README.md"), "utf8");
  const m = /## Quickstart\n\n```ts\n([\s\S]*?)```/.exec(readme);
  assert.ok(m, "no ```ts block under ## Quickstart in README.md");
  const lines = m[1]!.trimEnd().split("\n").filter((l) => l.trim() !== "");
  assert.ok(lines.length <= 10, `the quickstart has ${lines.length} lines; keep it to 10`);
  assert.match(await runBlock(m[1]!), /holding jobs\/nightly with fencing token \d+/);
});

test("the repository README's TypeScript example runs", { timeout: 30_000 }, async () => {
  const readme = readFileSync(need("LOCKDTEST_REPO_README"), "utf8");
  const m = /## Using lockd from TypeScript\n[\s\S]*?```ts\n([\s\S]*?)```/.exec(readme);
  assert.ok(m, "no ```ts block under ## Using lockd from TypeScript in the repository's README.md");
  await runBlock(m[1]!);
});
