// The HTTP transport against a real lockd (the harness's server with
// lock.server.http.listen): a session kept alive by Heartbeat calls past its
// TTL, each answer held back 300 ms on its way to the SDK (a slow return
// path), and every deadline it set no later than that call's send time +
// TTL − margin — the send-time rule (C2 #ct2-deadline), which a deadline
// counted from the answer's arrival breaks (LOCKD_TSSDK_CONTROL=recvtime).
// Acquire, acquireAll, inspect, release, hotKeys and watch go over HTTP too.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "../../src/client.js";
import { HttpApi, nodeTransport, type HttpTransport } from "../../src/http.js";
import type { Session } from "../../src/session.js";
import { eventually, key, need } from "./env.js";

const SLOW_ANSWER_MS = 300;

test("over HTTP: Heartbeat calls keep a lock past its TTL, each deadline from its call's send time", { timeout: 30_000 }, async (t) => {
  const addr = need("LOCKDTEST_HTTP_ADDR");
  const real = nodeTransport({});
  let s: Session | undefined;
  const seen: { sent: number; deadline: number }[] = [];
  // The latest send time of a call that extends trust (open, acquire, heartbeat) whose answer the SDK got: the
  // session's deadline may come from any of them.
  let latest = 0;
  const transport: HttpTransport = {
    async send(a, verb, path, body, signal) {
      const sent = performance.now();
      const r = await real.send(a, verb, path, body, signal);
      const trustCall = path === "/v1/sessions" || path.endsWith(":acquire") || path.endsWith(":keepalive");
      if (r.status === 200 && trustCall && !path.endsWith(":keepalive")) latest = Math.max(latest, sent);
      if (!path.endsWith(":keepalive") || r.status !== 200) return r;
      await new Promise((res) => setTimeout(res, SLOW_ANSWER_MS)); // the answer's slow way back
      latest = Math.max(latest, sent);
      setImmediate(() => s && seen.push({ sent: latest, deadline: s.deadline })); // once the SDK applied it
      return r;
    },
    stream: real.stream,
  };
  const api = new HttpApi({ addresses: [addr], transport, now: () => performance.now() });
  const log: string[] = [];
  const c = new Client(addr, { api, backoffMinMs: 10, backoffMaxMs: 200, logger: (m, d) => log.push(`${m}: ${String(d)}`) });
  t.after(async () => {
    await c.close();
    real.close();
  });
  s = await c.newSession({ ttlMs: 3000 });
  const k = key("http");
  const ac = new AbortController();
  t.after(() => ac.abort());
  const it = (await c.watch(k, { signal: ac.signal }))[Symbol.asyncIterator](); // GET /v1/watch, JSON lines
  const l = await s.acquire(k);
  const ev = (await it.next()).value!;
  assert.equal(`${ev.kind} ${ev.key}`, `acquired ${k}`, "watch over HTTP");
  assert.ok(l.token > 0n);
  const info = await c.inspect(k);
  assert.equal(info.session, s.id, "inspect over HTTP: the holder");
  const until = performance.now() + s.ttlMs * 1.5;
  await eventually(s.ttlMs * 4, "1.5 TTL passed with three answered heartbeats", () => (performance.now() > until && seen.length >= 3) || !l.valid());
  assert.ok(l.valid(), `lock lost over HTTP after ${s.ttlMs * 1.5} ms: ${l.err}; ${log.join("; ")}`);
  for (const [i, x] of seen.entries()) {
    assert.ok(x.deadline <= x.sent + s.ttlMs - s.marginMs,
      `heartbeat ${i}: deadline sent+${(x.deadline - x.sent).toFixed(1)} ms, beyond send + TTL − margin = sent+${s.ttlMs - s.marginMs} ms`);
  }
  assert.ok(seen.some((x) => x.deadline > x.sent + s!.ttlMs / 2), "no heartbeat answer extended the deadline");
  t.diagnostic(`${seen.length} Heartbeat calls, answers ${SLOW_ANSWER_MS} ms late; deadline − send: ` +
    seen.map((x) => (x.deadline - x.sent).toFixed(0)).join(", ") + ` ms (TTL ${s.ttlMs}, margin ${s.marginMs})`);
  await l.release();
  assert.equal((await c.inspect(k)).held, false, "released over HTTP");
  const both = await s.acquireAll([`${k}/y`, `${k}/x`]); // POST /v1/locks:acquire, the keys in the body
  assert.deepEqual(both.map((x) => x.key), [`${k}/y`, `${k}/x`], "acquireAll over HTTP");
  for (const x of both) await x.release();
  const hk = await c.hotKeys(k, { limit: 5 }); // GET /v1/hotkeys, query prefix and limit
  assert.equal(typeof hk.enabled, "boolean", "hotKeys over HTTP");
  const ev2 = (await it.next()).value!;
  assert.equal(`${ev2.kind} ${ev2.key}`, `released ${k}`, "watch over HTTP");
  ac.abort();
  await it.return?.();
});

// A stalled HTTP replica (C2 #ct2-failover): the client's first address is
// the last HTTP replica behind a proxy, its second the one before it. The
// proxy hangs (nothing arrives either way, no reset) while the client waits
// for a key; a Heartbeat call goes unanswered, the client moves, and the
// waiting Acquire resumes its place on the other replica and is granted.
test("over HTTP: a waiting acquire moves off a stalled replica with the client", { timeout: 60_000 }, async (t) => {
  const http = need("LOCKDTEST_HTTP_REPLICAS").split(",");
  const stall = (action: string) =>
    fetch(`${need("LOCKDTEST_CONTROL")}/proxy/httpreplica/${action}`, { method: "POST" }).then((r) => assert.equal(r.status, 200));
  const c = new Client(`${need("LOCKDTEST_HTTP_REPLICA_PROXY")},${http[1]}`, { http: true, backoffMinMs: 10, backoffMaxMs: 200 });
  const holder = new Client(http[1]!, { http: true });
  t.after(async () => {
    await stall("restore");
    await Promise.all([c.close(), holder.close()]);
  });
  const k = key("http-stalled");
  const h = await (await holder.newSession()).acquire(k);
  const s = await c.newSession();
  const waiting = s.acquire(k);
  await eventually(10_000, "the waiter queued", async () => (await holder.inspect(k)).waiters.includes(s.id));
  await stall("pause");
  await h.release();
  // The stall is noticed half an interval after a Heartbeat goes
  // unanswered; the acquire then resumes its place on the other replica.
  const bound = 2 * s.intervalMs + 5000;
  const timeout = new Promise<string>((r) => setTimeout(() => r("timeout"), bound).unref());
  const got = await Promise.race([waiting, timeout]);
  assert.notEqual(got, "timeout", `the waiter was not granted within ${bound} ms while its HTTP replica stalled`);
  const l = await waiting;
  assert.ok(l.valid() && s.valid(), `lock not trusted: ${l.err ?? s.err}`);
  await l.release();
});

// TTL 6 s: the lock outlives a TTL after each move only if Heartbeat calls
// to another replica were answered meanwhile. The client is on the first
// HTTP replica; it is drained and stopped (the client is told to move),
// then the second, where the client went, is killed (the client learns it
// from a failed call and moves to the third).
test("over HTTP: a lock stays trusted while its client leaves a draining replica, then a killed one", { timeout: 90_000 }, async (t) => {
  const first = Number(need("LOCKDTEST_HTTP_REPLICA_FIRST"));
  const c = new Client(need("LOCKDTEST_HTTP_REPLICAS"), { http: true, backoffMinMs: 10, backoffMaxMs: 200 });
  t.after(() => c.close());
  const s = await c.newSession({ ttlMs: 6000 });
  const l = await s.acquire(key("http-drain"));
  for (const [i, action] of [[first, "stop"], [first + 1, "kill"]] as const) {
    const r = await fetch(`${need("LOCKDTEST_CONTROL")}/replica/${i}/${action}`, { method: "POST" }); // stop drains first
    assert.equal(r.status, 200, await r.text());
    const after = performance.now();
    await eventually(3 * s.ttlMs, `a TTL after replica ${i} ${action}`, () => performance.now() > after + s.ttlMs || !l.valid());
    assert.ok(l.valid() && s.valid(), `lock lost over HTTP after replica ${i} ${action}: ${l.err ?? s.err}`);
    t.diagnostic(`${action}: lock kept ${Math.round(performance.now() - after)} ms past it (TTL ${s.ttlMs} ms)`);
  }
  const l2 = await s.acquire(key("http-after-moves"), { signal: AbortSignal.timeout(10_000) }); // on the third replica
  await l2.release();
  await l.release();
});
