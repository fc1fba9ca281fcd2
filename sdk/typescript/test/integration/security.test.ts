// TLS, mutual TLS and bearer tokens (C5 #ct5-tls, #ct5-auth; C2 #ct2-wire-auth).
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client, InvalidArgumentError, PermissionDeniedError } from "../../src/index.js";
import { key, need } from "./env.js";

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

test("plaintext and bearer tokens only to loopback unless asked", () => {
  assert.throws(() => new Client("lockd.example:7420"), InvalidArgumentError);
  assert.throws(() => new Client("lockd.example:7420", { insecure: true, token: "t" }), InvalidArgumentError);
  assert.throws(() => new Client("not an address"), InvalidArgumentError);
  void new Client("lockd.example:7420", { insecure: true }).close();
});
