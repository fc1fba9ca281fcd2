// acquire(key, { onWaitUpdate }) against a real lockd (one row per backend,
// started by test/sdk): C2 #ct2-wait-updates, issue 27.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { Client } from "../../src/client.js";
import { InvalidArgumentError } from "../../src/errors.js";
import type { WaitUpdate } from "../../src/index.js";
import { client, eventually } from "./env.js";

/** Counts the Inspect calls client c sends, per key (a spy on the SDK's wire; the server is real). */
function countInspects(c: Client): Map<string, number> {
  const calls = new Map<string, number>();
  const api = c.api;
  const inspect = api.inspect.bind(api);
  api.inspect = (req, opts) => {
    calls.set(req.key, (calls.get(req.key) ?? 0) + 1);
    return inspect(req, opts);
  };
  return calls;
}

test("onWaitUpdate: position 1 of 1, the estimate once holds ended, none after the grant; without it no Inspect", { timeout: 60_000 }, async (t) => {
  const c = client(t);
  const look = client(t); // the test's own reads, not counted
  const calls = countInspects(c);
  const pre = `tswu${process.pid}${Date.now()}`; // a first segment of its own: a template with no history
  const key = `${pre}/k`;
  const plain = `${pre}/plain`;
  const h = await c.newSession();
  const w = await c.newSession();
  const p = await c.newSession();
  await assert.rejects(w.acquire(key, { onWaitUpdate: () => {}, waitUpdateEveryMs: 50 }), InvalidArgumentError);
  for (const wantEstimate of [false, true]) {
    const l = await h.acquire(key);
    const pl = await h.acquire(plain);
    const got: WaitUpdate[] = [];
    let returned = false;
    const late: WaitUpdate[] = [];
    const base = calls.get(key) ?? 0;
    const waiting = w.acquire(key, {
      waitUpdateEveryMs: 100,
      onWaitUpdate: (u) => {
        if (returned) late.push(u);
        got.push(u);
      },
    }).finally(() => { returned = true; });
    const plainWaiting = p.acquire(plain);
    const first = () => got.find((u) => u.error === undefined && u.position === 1 && u.waiters === 1 &&
      (u.estimateMs !== undefined || !wantEstimate));
    await eventually(30_000, "an update with position 1 of 1", () => first() !== undefined);
    const u = first()!;
    assert.equal(u.key, key);
    assert.equal(u.info?.held, true);
    assert.equal(u.info?.token, l.token);
    assert.equal(u.info?.session, h.id);
    if (wantEstimate) assert.ok(u.estimateMs! >= 0, `estimateMs ${u.estimateMs}`);
    else assert.equal(u.estimateMs, undefined, "no hold ended yet: no estimate");
    // The plain acquire, queued, waited beside the other for more than the first read's delay (4 reads of key).
    await eventually(30_000, "the plain waiter queued and 4 reads of the key", async () =>
      (await look.inspect(plain)).waiters.includes(p.id) && (calls.get(key) ?? 0) >= base + 4);
    assert.equal(calls.get(plain) ?? 0, 0, "an acquire without onWaitUpdate sent Inspect");
    await l.release();
    await pl.release();
    await (await waiting).release();
    await (await plainWaiting).release();
    const n = got.length;
    await new Promise((r) => setImmediate(r)); // anything already scheduled runs: none may report
    assert.equal(got.length, n);
    assert.deepEqual(late, []);
  }
  assert.equal(calls.get(plain) ?? 0, 0);
  await h.close();
  await w.close();
  await p.close();
});
