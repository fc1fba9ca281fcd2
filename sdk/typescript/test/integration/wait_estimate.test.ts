// LockInfo.waitEstimates from Client.inspect against a real lockd (one row
// per backend, started by test/sdk), over gRPC and HTTP: C2
// #ct2-wait-estimate, issue 27.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "../../src/client.js";
import { client, eventually, need } from "./env.js";

test("waitEstimates: none with no hold observed; one per waiter once holds of the key ended, over gRPC and HTTP", { timeout: 30_000 }, async (t) => {
  const c = client(t);
  const hc = new Client(need("LOCKDTEST_HTTP_ADDR"), { http: true, backoffMinMs: 10, backoffMaxMs: 200 });
  t.after(() => hc.close());
  const k = `tseta${process.pid}${Date.now()}/k`; // a first segment of its own: a template with no history
  const a = await c.newSession();
  const w = await c.newSession();
  const queuedBehind = async () => {
    const first = await a.acquire(k);
    const waiting = w.acquire(k);
    await eventually(5000, "w queued", async () => (await c.inspect(k)).waiters.includes(w.id));
    const infos = [await c.inspect(k), await hc.inspect(k)];
    await first.release();
    await (await waiting).release();
    return infos;
  };
  for (const info of await queuedBehind()) assert.deepEqual(info.waitEstimates, [], "no hold observed: no estimate");
  for (const info of await queuedBehind()) { // a's and w's holds ended
    assert.equal(info.waitEstimates.length, 1, JSON.stringify(info.waitEstimates));
    const e = info.waitEstimates[0]!;
    assert.equal(e.session, w.id);
    assert.equal(e.position, 1);
    assert.ok(e.waitMs >= 0, `waitMs ${e.waitMs}`);
  }
  await a.close();
  await w.close();
});
