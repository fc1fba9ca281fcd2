// The SDK against a real lockd (one row per backend, started by test/sdk).
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  DeadlockError, InvalidArgumentError, LimitMismatchError, LockedError, LockLostError, MaxHoldError, NotOwnerError, ReleasedError, WaitTimeoutError, type Lock,
} from "../../src/index.js";
import { backend, client, eventually, key } from "./env.js";

test("acquire, fencing tokens rise, release hands over", { timeout: 30_000 }, async (t) => {
  const c = client(t);
  const a = await c.newSession({ owner: "ts-a" });
  const b = await c.newSession();
  const k = key("lock");
  const la = await a.acquire(k, { value: "v1" });
  assert.ok(la.valid());
  const info = await c.inspect(k);
  assert.equal(info.session, a.id);
  assert.equal(info.token, la.token);
  assert.equal(info.owner, "ts-a");
  assert.equal(new TextDecoder().decode(info.value), "v1");
  await assert.rejects(b.tryAcquire(k), (e) => e instanceof LockedError && /ts-a/.test(e.message));
  const waiting = b.acquire(k);
  await eventually(5000, "b queued", async () => (await c.inspect(k)).waiters.includes(b.id));
  await la.release();
  assert.ok(la.err instanceof ReleasedError);
  assert.ok(la.signal.aborted);
  const lb = await waiting;
  assert.ok(lb.token > la.token, `token ${lb.token} not above ${la.token}`);
  await lb.release();
});

test("FIFO: waiters are granted in the order they queued", { timeout: 30_000 }, async (t) => {
  const c = client(t);
  const k = key("fifo");
  const holder = await c.newSession();
  const first = await holder.acquire(k);
  const sessions = [await c.newSession(), await c.newSession(), await c.newSession()];
  const order: number[] = [];
  const waits: Promise<Lock>[] = [];
  for (const [i, s] of sessions.entries()) {
    waits.push(s.acquire(k).then((l) => (order.push(i), l)));
    await eventually(5000, `waiter ${i} queued`, async () => (await c.inspect(k)).waiters.length === i + 1);
  }
  await first.release();
  for (const w of waits) await (await w).release();
  assert.deepEqual(order, [0, 1, 2]);
});

test("a wait ends on its timeout or its AbortSignal, and gives up its place", { timeout: 30_000 }, async (t) => {
  const c = client(t);
  const k = key("wait");
  const a = await c.newSession();
  const b = await c.newSession();
  const l = await a.acquire(k);
  await assert.rejects(b.acquire(k, { waitTimeoutMs: 200 }), WaitTimeoutError);
  const ac = new AbortController();
  const p = b.acquire(k, { signal: ac.signal });
  await eventually(5000, "b queued", async () => (await c.inspect(k)).waiters.includes(b.id));
  ac.abort();
  await assert.rejects(p, (e: Error) => e.name === "AbortError");
  await eventually(5000, "b left the queue", async () => (await c.inspect(k)).waiters.length === 0);
  await l.release();
  assert.equal((await c.inspect(k)).held, false, "the key was handed to the waiter that gave up");
});

test("heartbeats keep a lock beyond its TTL", { timeout: 30_000 }, async (t) => {
  const c = client(t);
  const s = await c.newSession();
  const l = await s.acquire(key("long"));
  const until = performance.now() + s.ttlMs * 1.5;
  await eventually(s.ttlMs * 3, "1.5 TTL passed", () => performance.now() > until || !l.valid());
  assert.ok(l.valid(), `lock lost after ${s.ttlMs * 1.5} ms: ${l.err}`);
  assert.ok(l.deadline > performance.now());
});

test("a revoke aborts the lock's signal with LockLostError; the session lives on", { timeout: 30_000 }, async (t) => {
  const c = client(t);
  const s = await c.newSession();
  const k = key("revoke");
  const l = await s.acquire(k);
  const aborted = new Promise((r) => l.signal.addEventListener("abort", r));
  const rv = await c.revoke(k);
  assert.equal(rv.token, l.token);
  await aborted;
  assert.ok(l.err instanceof LockLostError, `err ${l.err}`);
  assert.ok(s.valid());
  await assert.rejects(l.release(), NotOwnerError);
  const again = await s.acquire(k);
  assert.ok(again.token > l.token);
});

test("semaphores and shared/exclusive locks; a kind mismatch is LimitMismatchError", { timeout: 30_000 }, async (t) => {
  const c = client(t);
  const [a, b, d] = [await c.newSession(), await c.newSession(), await c.newSession()];
  const sem = key("sem");
  const s1 = await a.acquire(sem, { limit: 2 });
  const s2 = await b.acquire(sem, { limit: 2 });
  assert.notEqual(s1.token, s2.token);
  await assert.rejects(d.tryAcquire(sem, { limit: 2 }), LockedError);
  await assert.rejects(d.tryAcquire(sem, { limit: 3 }), LimitMismatchError);
  const rw = key("rw");
  const r1 = await a.acquire(rw, { mode: "shared" });
  const r2 = await b.acquire(rw, { mode: "shared" });
  await assert.rejects(d.tryAcquire(rw, { mode: "exclusive" }), LockedError);
  const w = d.acquire(rw, { mode: "exclusive" });
  await r1.release();
  await r2.release();
  const wl = await w;
  assert.ok(wl.token > r2.token);
  const info = await c.inspect(sem);
  assert.equal(info.holders.length, 2);
  assert.equal(info.limit, 2);
});

test("election: campaign, observe, proclaim, resign", { timeout: 30_000 }, async (t) => {
  const c = client(t);
  const name = key("election");
  const ac = new AbortController();
  t.after(() => ac.abort());
  const seen: string[] = [];
  const observed = (async () => {
    for await (const l of c.observe(name, { signal: ac.signal })) {
      seen.push(l === null ? "none" : new TextDecoder().decode(l.value));
    }
  })();
  await eventually(5000, "no leader observed", () => seen.includes("none"));
  const a = await c.newSession();
  const b = await c.newSession();
  const lead = await a.campaign(name, "a");
  const next = b.campaign(name, "b");
  await eventually(5000, "leader a observed", () => seen.includes("a"));
  await lead.proclaim("a2");
  await eventually(5000, "proclaimed value observed", () => seen.includes("a2"));
  await lead.resign();
  const lb = await next;
  assert.ok(lb.token > lead.token);
  await eventually(5000, "leader b observed", () => seen.includes("b"));
  ac.abort();
  await observed;
  assert.ok(seen.indexOf("a") < seen.indexOf("a2") && seen.indexOf("a2") < seen.indexOf("b"), seen.join(","));
});

test("watch delivers events in order and resumes from a cursor", { timeout: 30_000 }, async (t) => {
  const c = client(t);
  const prefix = key("watch") + "/";
  const s = await c.newSession();
  const ac = new AbortController();
  const events: { kind: string; key: string; cursor: string }[] = [];
  const it = (await c.watch(prefix, { signal: ac.signal }))[Symbol.asyncIterator]();
  const next = async () => (await it.next()).value!;
  const l = await s.acquire(prefix + "a");
  events.push(await next());
  await l.release();
  events.push(await next());
  assert.deepEqual(events.map((e) => e.kind + " " + e.key.slice(prefix.length)), ["acquired a", "released a"]);
  ac.abort();
  await it.return?.();
  // Changes while nobody watches, then a watch resumed from the last cursor.
  const l2 = await s.acquire(prefix + "b");
  const ac2 = new AbortController();
  t.after(() => ac2.abort());
  const it2 = (await c.watch(prefix, { signal: ac2.signal, resumeAfter: events[1]!.cursor }))[Symbol.asyncIterator]();
  const first = (await it2.next()).value!;
  if (backend() === "pg") {
    assert.equal(first.kind, "resync", "PostgreSQL keeps no history: a resumed watch starts with a resync");
  } else {
    assert.equal(first.kind + " " + first.key.slice(prefix.length), "acquired b", "etcd replays from its history");
  }
  await l2.release();
  ac2.abort();
  await it2.return?.();
});

test("closing a session releases its locks", { timeout: 30_000 }, async (t) => {
  const c = client(t);
  const s = await c.newSession();
  const k = key("close");
  const l = await s.acquire(k);
  await s.close();
  assert.ok(l.signal.aborted);
  assert.equal((await c.inspect(k)).held, false);
});

test("maximum hold and lock-delay (C2 #ct2-delay)", { timeout: 30_000 }, async (t) => {
  const c = client(t);
  const s = await c.newSession();
  const other = await c.newSession();
  // A grant held past its maximum hold is revoked by the server: MaxHoldError, the session lives on.
  const held = await s.acquire(key("maxhold"), { maxHoldMs: 1000 });
  await new Promise((r) => held.signal.addEventListener("abort", r));
  assert.ok(held.err instanceof MaxHoldError, `err ${held.err}`);
  assert.ok(held.err instanceof LockLostError);
  assert.ok(s.valid());
  // A revoked grant with a lock-delay keeps the key from the next holder for the delay.
  const k = key("delay");
  const l = await s.acquire(k, { lockDelayMs: 2000 });
  assert.equal((await c.inspect(k)).lockDelayMs, 2000);
  await c.revoke(k);
  const info = await c.inspect(k);
  assert.equal(info.held, false);
  assert.ok(info.delayRemainingMs > 0, `delay remaining ${info.delayRemainingMs}`);
  await assert.rejects(other.tryAcquire(k), LockedError);
  const after = await other.acquire(k, { signal: AbortSignal.timeout(15_000) });
  assert.ok(after.token > l.token);
});

test("checkToken: current, stale after a re-grant, a free key, token 0 refused (C2 #ct2-check-token)", { timeout: 30_000 }, async (t) => {
  const c = client(t);
  const a = await c.newSession();
  const b = await c.newSession();
  const k = key("check");
  const la = await a.acquire(k);
  for (const cached of [false, true]) {
    const got = await c.checkToken(k, la.token, { cached });
    assert.ok(got.current, `cached=${cached}: ${JSON.stringify(got, (_, v) => (typeof v === "bigint" ? String(v) : v))}`);
    assert.deepEqual(got.tokens, [la.token]);
  }
  await la.release();
  const lb = await b.acquire(k);
  const stale = await c.checkToken(k, la.token);
  assert.equal(stale.current, false);
  assert.equal(stale.cached, false);
  assert.deepEqual(stale.tokens, [lb.token]);
  await eventually(10_000, "the cached check sees the re-grant", async () => !(await c.checkToken(k, la.token, { cached: true })).current);
  assert.equal((await c.checkToken(key("check-free"), 7n)).current, false);
  await assert.rejects(c.checkToken(k, 0n), (e) => e instanceof InvalidArgumentError);
  await lb.release();
});

test("deadlock: the closing wait is refused with both keys, the other granted after the release; noDeadlockCheck moves the refusal (C2 #ct2-deadlock)", { timeout: 60_000 }, async (t) => {
  const c = client(t);
  for (const optOut of [false, true]) {
    const ka = key(`dl-${optOut}-a`);
    const kb = key(`dl-${optOut}-b`);
    const a = await c.newSession();
    const b = await c.newSession();
    const la = await a.acquire(ka);
    const lb = await b.acquire(kb);
    const settle = (p: Promise<unknown>) => p.then((v) => ({ v }), (e: unknown) => ({ e }));
    const aw = settle(a.acquire(kb));
    await eventually(10_000, "a queued for b", async () => (await c.inspect(kb)).waiters.length === 1);
    const bw = settle(b.acquire(ka, { noDeadlockCheck: optOut }));
    const [victim, other, give, keep] = optOut ? [aw, bw, la, lb] : [bw, aw, lb, la];
    const r = await victim;
    assert.ok("e" in r && r.e instanceof DeadlockError, `optOut=${optOut}: ${String("e" in r ? r.e : "granted")}`);
    assert.deepEqual((r.e as DeadlockError).keys, [ka, kb].sort());
    await give.release();
    const o = await other;
    assert.ok("v" in o, `optOut=${optOut}: the other wait failed: ${String("e" in o ? o.e : "")}`);
    await (o.v as Lock).release();
    await keep.release();
  }
});
