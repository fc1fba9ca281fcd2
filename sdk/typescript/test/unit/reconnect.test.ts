// The channel reconnects within the client's backoff (C2 #ct2-sdk rule 11), not
// after a backoff grpc-js grew on its own: an address that closes every
// connection (a server not back yet) sees an attempt at least every 800 ms
// while a call retries for 4 s with backoffMaxMs 200. The old fixed channel
// options (100 ms growing by 1.6 to 2 s) fail it: "the longest gap between
// connection attempts 901 ms".
import { test } from "node:test";
import assert from "node:assert/strict";
import * as net from "node:net";
import type { AddressInfo } from "node:net";
import { Client } from "../../src/client.js";
import { LockdError } from "../../src/errors.js";

test("the channel reconnects within backoffMaxMs, not grpc-js's own growing backoff", { timeout: 30_000 }, async () => {
  const attempts: number[] = [];
  const srv = net.createServer((sock) => {
    attempts.push(performance.now());
    sock.destroy();
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const addr = `127.0.0.1:${(srv.address() as AddressInfo).port}`;
  const c = new Client(addr, { backoffMinMs: 20, backoffMaxMs: 200 });
  try {
    await assert.rejects(c.inspect("k", { signal: AbortSignal.timeout(4000) }),
      (e: unknown) => e instanceof LockdError || (e instanceof DOMException && e.name === "TimeoutError"));
  } finally {
    await c.close();
    await new Promise<void>((r) => srv.close(() => r()));
  }
  const gaps = attempts.slice(1).map((t, i) => t - attempts[i]);
  const longest = Math.max(...gaps);
  assert.ok(attempts.length >= 5, `${attempts.length} connection attempts in 4 s`);
  // 200 ms × 1.2 (grpc-js's jitter) plus a loaded machine's scheduling: 800 ms.
  assert.ok(longest < 800, `the longest gap between connection attempts ${longest.toFixed(0)} ms (backoffMaxMs 200)`);
});
