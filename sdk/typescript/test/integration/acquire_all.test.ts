// Several locks at once (C2 #ct2-acquire-all) against a real lockd (one row per backend, started by test/sdk).
import { test } from "node:test";
import assert from "node:assert/strict";
import { DeadlockError, InvalidArgumentError, LockedError, WaitTimeoutError, type Lock } from "../../src/index.js";
import { client, eventually, key } from "./env.js";

test("acquireAll: every key with its own token in the order asked, or none", { timeout: 30_000 }, async (t) => {
  const c = client(t);
  const base = key("all");
  const [ka, kb, kc, k0] = ["a", "b", "c", "0"].map((s) => `${base}/${s}`);
  const s1 = await c.newSession();
  const s2 = await c.newSession();
  const locks = await s1.acquireAll([kc, ka]);
  assert.deepEqual(locks.map((l) => l.key), [kc, ka]);
  for (const l of locks) {
    assert.ok(l.valid());
    assert.equal((await c.inspect(l.key)).token, l.token);
  }
  await assert.rejects(s2.tryAcquireAll([k0, ka]), LockedError);
  assert.equal((await c.inspect(k0)).held, false);
  await assert.rejects(s2.acquireAll([k0, ka], { waitTimeoutMs: 300 }), WaitTimeoutError);
  assert.equal((await c.inspect(k0)).held, false);
  for (const bad of [[], [kb, kb], [""]]) {
    await assert.rejects(s2.acquireAll(bad), InvalidArgumentError, JSON.stringify(bad));
  }
  // An aborted wait holds nothing once the server has seen the abort.
  const ac = new AbortController();
  const p = s2.acquireAll([k0, ka], { signal: ac.signal });
  await eventually(5000, "s2 queued for a", async () => (await c.inspect(ka)).waiters.includes(s2.id));
  assert.equal((await c.inspect(k0)).session, s2.id);
  ac.abort();
  await assert.rejects(p, (e: Error) => e.name === "AbortError");
  await eventually(5000, "s2 gave everything back", async () =>
    (await c.inspect(ka)).waiters.length === 0 && !(await c.inspect(k0)).held);
  for (const l of locks) await l.release();
  const got = await s2.tryAcquireAll([k0, ka]);
  assert.ok(got[1].token > locks[1].token, `token ${got[1].token} not above ${locks[1].token}`);
  for (const l of got) await l.release();
});

test("acquireAll: a wait that closes a cycle is DeadlockError and gives back the key it took (C2 #ct2-deadlock)", { timeout: 60_000 }, async (t) => {
  const c = client(t);
  const base = key("alldl");
  const [ka, kb, k0] = ["a", "b", "0"].map((s) => `${base}/${s}`);
  const a = await c.newSession();
  const b = await c.newSession();
  await a.acquire(kb);
  const la = await b.acquire(ka);
  const settle = (p: Promise<Lock>) => p.then((v) => ({ v }), (e: unknown) => ({ e }));
  const aw = settle(a.acquire(ka));
  await eventually(10_000, "a queued for a", async () => (await c.inspect(ka)).waiters.length === 1);
  // b takes k0, then waits for kb (held by a, who waits for ka, held by b).
  const err = await b.acquireAll([kb, k0]).then(() => undefined, (e: unknown) => e);
  assert.ok(err instanceof DeadlockError, String(err));
  assert.deepEqual(err.keys, [ka, kb]);
  assert.equal((await c.inspect(k0)).held, false);
  await la.release();
  const r = await aw;
  assert.ok("v" in r, `a's wait failed: ${String("e" in r ? r.e : "")}`);
});

test("acquireAll with noDeadlockCheck: the other, older wait is refused and the set is granted (C2 #ct2-acquire-all)", { timeout: 60_000 }, async (t) => {
  const c = client(t);
  const base = key("alldlo");
  const [ka, kb, k0] = ["a", "b", "0"].map((s) => `${base}/${s}`);
  const a = await c.newSession();
  const b = await c.newSession();
  const lb = await a.acquire(kb);
  const la = await b.acquire(ka);
  const settle = <T>(p: Promise<T>) => p.then((v) => ({ v }), (e: unknown) => ({ e }));
  const aw = settle(a.acquire(ka));
  await eventually(10_000, "a queued for a", async () => (await c.inspect(ka)).waiters.length === 1);
  const bw = settle(b.acquireAll([kb, k0], { noDeadlockCheck: true }));
  const r = await aw;
  assert.ok("e" in r && r.e instanceof DeadlockError, `a's wait: ${String("e" in r ? r.e : "granted")}`);
  await lb.release();
  const rb = await bw;
  assert.ok("v" in rb, `b's acquireAll failed: ${String("e" in rb ? rb.e : "")}`);
  for (const l of [...rb.v, la]) await l.release();
});
