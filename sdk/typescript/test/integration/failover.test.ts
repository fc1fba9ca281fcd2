// Several replicas of one backend (C2 #ct2-failover, #ct2-drain): the client
// leaves a draining replica and a killed one, and its session and lock stay
// trusted throughout. The harness drains or kills a replica on request.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "../../src/index.js";
import { eventually, key, need } from "./env.js";

async function control(i: number, action: "stop" | "kill"): Promise<void> {
  const r = await fetch(`${need("LOCKDTEST_CONTROL")}/replica/${i}/${action}`, { method: "POST" });
  assert.equal(r.status, 200, `replica ${i} ${action}: ${await r.text()}`);
}

test("a lock stays trusted while its client leaves a draining replica, then a killed one", { timeout: 60_000 }, async (t) => {
  const c = new Client(need("LOCKDTEST_REPLICAS"), { backoffMinMs: 10, backoffMaxMs: 200 });
  t.after(() => c.close());
  const s = await c.newSession();
  const l = await s.acquire(key("failover"));
  const ttl = s.ttlMs;
  for (const [i, action] of [[0, "stop"], [1, "kill"]] as const) {
    await control(i, action); // the client is on replica i (it moves on, in order)
    const after = performance.now();
    await eventually(3 * ttl, `deadline extended by another replica after replica ${i} ${action}`,
      () => !l.valid() || l.deadline > after + ttl / 2);
    assert.ok(l.valid(), `lock lost after replica ${i} ${action}: ${l.err}`);
    assert.ok(s.valid(), `session lost after replica ${i} ${action}: ${s.err}`);
  }
  const l2 = await s.acquire(key("after"), { signal: AbortSignal.timeout(10_000) });
  assert.ok(l2.valid());
  await l.release();
  await l2.release();
});
