// Outages between the client and a real lockd (a proxy the harness pauses
// and cuts): the equivalents of the Go SDK's TestLostNoticeRedelivered and
// TestDoneWhileServerUnreachable (C2 #ct2-confirm, #ct2-deadline).
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client, LockLostError, SessionExpiredError } from "../../src/index.js";
import { client, eventually, key, need } from "./env.js";

async function proxy(action: "pause" | "cut" | "restore"): Promise<void> {
  const r = await fetch(`${need("LOCKDTEST_CONTROL")}/proxy/server/${action}`, { method: "POST" });
  assert.equal(r.status, 200, `proxy ${action}: ${await r.text()}`);
}

function viaProxy(t: { after(fn: () => Promise<void> | void): void }): Client {
  const c = new Client(need("LOCKDTEST_PROXY"), { backoffMinMs: 10, backoffMaxMs: 100 });
  t.after(async () => {
    await proxy("restore");
    await c.close();
  });
  return c;
}

test("a lock-lost notice lost on the wire still ends the lock; the session lives on", { timeout: 30_000 }, async (t) => {
  const admin = client(t);
  const c = viaProxy(t);
  const s = await c.newSession();
  const k = key("notice");
  const l = await s.acquire(k);
  await proxy("pause");
  const rv = await admin.revoke(k);
  assert.equal(rv.token, l.token);
  await proxy("cut"); // drops the notice the server wrote into the paused connection
  await proxy("restore");
  const bound = s.intervalMs + 2000; // the next heartbeat answer, a reconnect, slack for a loaded machine
  await eventually(bound, "lock ended after a revoke whose notice was lost on the wire", () => l.signal.aborted);
  assert.ok(l.err instanceof LockLostError, `lock error ${l.err}`);
  assert.ok(s.valid(), `session ended (${s.err}); want only the lock lost`);
});

test("trust ends at the deadline while the server is unreachable, before the backend frees the key", { timeout: 60_000 }, async (t) => {
  const admin = client(t);
  const c = viaProxy(t);
  const s = await c.newSession();
  const k = key("unreachable");
  const l = await s.acquire(k);
  await eventually(10_000, "deadline extended by heartbeats", () => l.deadline > performance.now() + s.ttlMs / 2);
  const doneAt = new Promise<number>((r) => l.signal.addEventListener("abort", () => r(performance.now())));
  const stoppedAt = performance.now();
  await proxy("pause");
  const deadline = l.deadline;
  let freeAt = 0;
  await eventually(s.ttlMs + 15_000, "key freed by the backend", async () => {
    if ((await admin.inspect(k)).held) return false;
    freeAt = performance.now();
    return true;
  });
  const done = await Promise.race([doneAt, Promise.resolve(Infinity)]);
  assert.ok(done < freeAt, `client trusted its lock until ${done - stoppedAt} ms after the pause; the backend freed it at ${freeAt - stoppedAt} ms`);
  assert.ok(done >= deadline, `lock signal aborted ${deadline - done} ms before the lock's deadline`);
  assert.ok(s.err instanceof SessionExpiredError, `session error ${s.err}; want the local deadline (SessionExpiredError)`);
  t.diagnostic(`pause → client stopped trusting: ${Math.round(done - stoppedAt)} ms; pause → backend freed the key: ${Math.round(freeAt - stoppedAt)} ms`);
});
