// TLS, mutual TLS and bearer tokens (C5 #ct5-tls, #ct5-auth; C2 #ct2-wire-auth).
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client, InvalidArgumentError, PermissionDeniedError, type WaitUpdate } from "../../src/index.js";
import { eventually, key, need } from "./env.js";

test("mutual TLS: a client certificate of the CA is accepted", { timeout: 30_000 }, async (t) => {
  const c = new Client(need("LOCKDTEST_TLS_ADDR"), {
    tls: { caFile: need("LOCKDTEST_TLS_CA"), certFile: need("LOCKDTEST_TLS_CERT"), keyFile: need("LOCKDTEST_TLS_KEY") },
  });
  t.after(() => c.close());
  const s = await c.newSession();
  const l = await s.acquire(key("mtls"));
  assert.ok(l.valid());
  await l.release();
});

test("mutual TLS: no client certificate, no session", { timeout: 30_000 }, async (t) => {
  const c = new Client(need("LOCKDTEST_TLS_ADDR"), { tls: { caFile: need("LOCKDTEST_TLS_CA") }, backoffMaxMs: 100 });
  t.after(() => c.close());
  await assert.rejects(c.newSession({ signal: AbortSignal.timeout(1500) }));
});

test("bearer token: the token's principal is allowed, a wrong token and no token are refused", { timeout: 30_000 }, async (t) => {
  const addr = need("LOCKDTEST_TOKEN_ADDR");
  const ok = new Client(addr, { tokenFile: need("LOCKDTEST_TOKEN_FILE") });
  t.after(() => ok.close());
  const s = await ok.newSession();
  const l = await s.acquire(key("token"));
  await l.release();

  const wrong = new Client(addr, { token: "not-the-token" });
  t.after(() => wrong.close());
  await assert.rejects(wrong.newSession(), (e) => e instanceof PermissionDeniedError && e.reason === "UNAUTHENTICATED");
  const anon = new Client(addr);
  t.after(() => anon.close());
  await assert.rejects(anon.newSession(), (e) => e instanceof PermissionDeniedError && e.reason === "ACCESS_DENIED");
});

for (const http of [false, true]) {
test(`closeSessions${http ? " over HTTP" : ""}: an admin closes every session of a principal, a caller without admin is refused`, { timeout: 30_000 }, async (t) => {
  const addr = need(http ? "LOCKDTEST_TOKEN_HTTP_ADDR" : "LOCKDTEST_TOKEN_ADDR");
  const c = new Client(addr, { http, tokenFile: need("LOCKDTEST_TOKEN_FILE") });
  t.after(() => c.close());
  const s1 = await c.newSession();
  const s2 = await c.newSession();
  const a = key("closes-a"), b = key("closes-b");
  await s1.acquire(a);
  await s2.acquire(b);
  const admin = new Client(addr, { http, tokenFile: need("LOCKDTEST_TOKEN_FILE") });
  t.after(() => admin.close());
  const { closed, released } = await admin.closeSessions("alice");
  assert.ok(closed >= 2 && released >= 2, `closed ${closed}, released ${released}; want at least 2 and 2`);
  for (const k of [a, b]) assert.equal((await c.inspect(k)).held, false, k);
  // Each session learns it by its next heartbeat answer (an interval of the
  // 3 s TTL, and a reconnect on a loaded machine).
  for (const s of [s1, s2]) {
    if (!s.signal.aborted) {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("a closed session never learnt it")), 10_000);
        s.signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
      });
    }
    assert.equal(s.valid(), false);
  }
  const anon = new Client(addr, { http });
  t.after(() => anon.close());
  await assert.rejects(anon.closeSessions("alice"), (e) => e instanceof PermissionDeniedError && e.reason === "ACCESS_DENIED");
});
}

test("plaintext and bearer tokens only to loopback unless asked", () => {
  assert.throws(() => new Client("lockd.example:7420"), InvalidArgumentError);
  assert.throws(() => new Client("lockd.example:7420", { insecure: true, token: "t" }), InvalidArgumentError);
  assert.throws(() => new Client("not an address"), InvalidArgumentError);
  void new Client("lockd.example:7420", { insecure: true }).close();
});

test("over HTTP: mutual TLS (HTTPS with the CA and a client certificate) and a bearer token; Heartbeat calls extend the session", { timeout: 30_000 }, async (t) => {
  const c = new Client(need("LOCKDTEST_TLS_HTTP_ADDR"), {
    http: true, tls: { caFile: need("LOCKDTEST_TLS_CA"), certFile: need("LOCKDTEST_TLS_CERT"), keyFile: need("LOCKDTEST_TLS_KEY") },
  });
  t.after(() => c.close());
  const s = await c.newSession({ ttlMs: 3000 });
  const l = await s.acquire(key("https-mtls"));
  const d = l.deadline;
  await eventually(5000, "a Heartbeat call over HTTPS extended the lock", () => l.deadline > d);
  await l.release();
  const anon = new Client(need("LOCKDTEST_TLS_HTTP_ADDR"), { http: true, tls: { caFile: need("LOCKDTEST_TLS_CA") }, backoffMaxMs: 100 });
  t.after(() => anon.close());
  await assert.rejects(anon.newSession({ signal: AbortSignal.timeout(1500) }));

  const addr = need("LOCKDTEST_TOKEN_HTTP_ADDR");
  const ok = new Client(addr, { http: true, tokenFile: need("LOCKDTEST_TOKEN_FILE") });
  t.after(() => ok.close());
  const s2 = await ok.newSession();
  await (await s2.acquire(key("http-token"))).release();
  const wrong = new Client(addr, { http: true, token: "not-the-token" });
  t.after(() => wrong.close());
  await assert.rejects(wrong.newSession(), (e) => e instanceof PermissionDeniedError && e.reason === "UNAUTHENTICATED");
  const none = new Client(addr, { http: true });
  t.after(() => none.close());
  await assert.rejects(none.newSession(), (e) => e instanceof PermissionDeniedError && e.reason === "ACCESS_DENIED");
});

test("onWaitUpdate without read access: one PermissionDeniedError update, no read after it, the acquire granted (C2 #ct2-wait-updates)", { timeout: 60_000 }, async (t) => {
  const addr = need("LOCKDTEST_TOKEN_ADDR");
  const alice = new Client(addr, { tokenFile: need("LOCKDTEST_TOKEN_FILE"), backoffMinMs: 10, backoffMaxMs: 200 });
  t.after(() => alice.close());
  const locker = new Client(addr, { tokenFile: need("LOCKDTEST_LOCKER_TOKEN_FILE"), backoffMinMs: 10, backoffMaxMs: 200 });
  t.after(() => locker.close());
  // Inspect calls per client (a spy on the SDK's wire; the server is real).
  const spy = (c: Client) => {
    const calls = new Map<string, number>();
    const inspect = c.api.inspect.bind(c.api);
    c.api.inspect = (req, opts) => {
      calls.set(req.key, (calls.get(req.key) ?? 0) + 1);
      return inspect(req, opts);
    };
    return calls;
  };
  const calls = spy(locker);
  const aliceCalls = spy(alice);
  const k = `lockonly/${process.pid}/${Date.now()}/k`;
  const control = `lockonly/${process.pid}/${Date.now()}/control`;
  const h = await alice.newSession();
  const l = await h.acquire(k);
  const cl = await h.acquire(control);
  const w = await locker.newSession();
  const got: WaitUpdate[] = [];
  const controlGot: WaitUpdate[] = [];
  const waiting = w.acquire(k, { waitUpdateEveryMs: 100, onWaitUpdate: (u) => got.push(u) });
  // The control: alice, who may read, waits beside with the same option; her reads show the time that passed.
  const cw = await alice.newSession();
  const controlWaiting = cw.acquire(control, { waitUpdateEveryMs: 100, onWaitUpdate: (u) => controlGot.push(u) });
  await eventually(30_000, "an update", () => got.length > 0);
  const u = got[0]!;
  assert.ok(u.error instanceof PermissionDeniedError, `update error ${String(u.error)}`);
  assert.deepEqual([u.position, u.waiters, u.estimateMs, u.info], [0, 0, undefined, undefined]);
  const base = aliceCalls.get(control) ?? 0;
  await eventually(30_000, "the locker queued and 4 more reads of the control", async () =>
    (await alice.inspect(k)).waiters.includes(w.id) && (aliceCalls.get(control) ?? 0) >= base + 4);
  assert.deepEqual([got.length, calls.get(k)], [1, 1], "no read after the refusal");
  assert.ok(controlGot.some((c) => c.error === undefined && c.position === 1), "the control waiter got no position 1");
  await l.release();
  await cl.release();
  await (await waiting).release();
  await (await controlWaiting).release();
  await h.close();
  await w.close();
  await cw.close();
});
