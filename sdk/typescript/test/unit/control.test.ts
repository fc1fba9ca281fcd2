// The receive-time control built into the SDK (LOCKD_TSSDK_CONTROL=recvtime,
// src/session.ts trustFrom) is caught by the fake-clock timing rule it
// breaks: TestDeadlineFromSendTime (over gRPC, and over HTTP in
// http.test.ts) run in a child node with the control on fails, and passes
// without it. (The chaos suite catches the same control:
// control-recvtime-sdk-ts-pg, make chaos-typescript.)
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const timing = fileURLToPath(new URL("./timing.test.js", import.meta.url));
const overHttp = fileURLToPath(new URL("./http.test.js", import.meta.url)); // the same rule on the HTTP transport

function run(control: boolean): { status: number | null; out: string } {
  const env = { ...process.env };
  delete env["LOCKD_TSSDK_CONTROL"];
  delete env["NODE_TEST_CONTEXT"]; // a test run of its own, not a child of this one
  if (control) env["LOCKD_TSSDK_CONTROL"] = "recvtime";
  const r = spawnSync(process.execPath, ["--test", "--test-reporter=tap", "--test-name-pattern=TestDeadlineFromSendTime", timing, overHttp],
    { env, encoding: "utf8", timeout: 60_000 });
  return { status: r.status, out: r.stdout + r.stderr };
}

test("the receive-time control fails TestDeadlineFromSendTime; the SDK as shipped passes it", () => {
  const off = run(false);
  assert.equal(off.status, 0, off.out);
  assert.match(off.out, /^# pass 2$/m, off.out);
  const on = run(true);
  assert.notEqual(on.status, 0, on.out);
  assert.match(on.out, /^not ok \d+ - deadline counts from the send time/m, on.out);
  assert.match(on.out, /^not ok \d+ - over HTTP: the deadline counts from each call's send time/m, on.out);
});
