// Client.hotKeys against a real lockd (one row per backend, started by
// test/sdk): C2 #ct2-hotkeys, issue 27.
import { test } from "node:test";
import assert from "node:assert/strict";
import { InvalidArgumentError } from "../../src/index.js";
import { client, eventually, key } from "./env.js";

test("hotKeys: a key waited for ranks by wait, hold and contention; the prefix leaves another out; limit over 50 refused", { timeout: 30_000 }, async (t) => {
  const c = client(t);
  const hot = key("hot");
  const prefix = hot.slice(0, hot.lastIndexOf("/") + 1);
  const cold = key("cold"); // another test's prefix (key() numbers each call)
  const a = await c.newSession();
  const w = await c.newSession();
  const first = await a.acquire(hot);
  await (await a.acquire(cold)).release();
  const waiting = w.acquire(hot);
  await eventually(5000, "w queued", async () => (await c.inspect(hot)).waiters.includes(w.id));
  await first.release();
  await (await waiting).release();
  const keys = (hs: { key: string }[]) => hs.map((h) => h.key);
  await eventually(10_000, "hot ranks in all three rankings", async () => {
    const hk = await c.hotKeys(prefix);
    return hk.enabled && hk.windowMs === 60_000 && keys(hk.byWait).join() === hot && hk.byWait[0].score > 0n &&
      keys(hk.byHold).join() === hot && keys(hk.byContention).join() === hot && hk.byContention[0].score >= 1n;
  });
  // Control: without the prefix the other key is there.
  const all = keys((await c.hotKeys("", { limit: 50 })).byWait);
  assert.ok(all.includes(hot) && all.includes(cold), `byWait without a prefix: ${all}`);
  await assert.rejects(c.hotKeys("", { limit: 51 }), (e) => e instanceof InvalidArgumentError && e.field === "limit");
});
