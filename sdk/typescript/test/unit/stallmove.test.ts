// C2 #ct2-failover, "a stall move keeps sending", under a fake clock: the
// TypeScript equivalent of the Go SDK's TestStallMoveKeepsSlowReplica
// (issue 21). Replica A answers later than the stall bound, in the instant
// the client moved; the replica moved to (B) answers nothing. The session
// must live on A's answers to heartbeats sent after the move; once B
// answers, nothing more is sent to A.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "../../src/client.js";
import { stallAfter } from "../../src/keepalive.js";
import { FakeApi, FakeClock, flush } from "./fake.js";

test("a stall move keeps sending on the stalled stream until the new one answers (TestStallMoveKeepsSlowReplica)", async () => {
  const ttl = 10_000;
  const margin = 500;
  const interval = 1000;
  const clock = new FakeClock();
  const api = new FakeApi(clock, { ttlMs: ttl, marginMs: margin, intervalMs: interval, remainingMs: ttl });
  api.several = true;
  // Two replicas: after the move to B, a stall on B finds every other address (A) set aside and stays.
  api.setAside = (peer: string) => {
    api.asides.push(peer);
    return api.asides.length === 1;
  };
  const client = new Client("fake:1", { api, clock, closeTimeoutMs: 100 });
  const s = await client.newSession();
  await flush();
  const a = api.stream;
  a.answerLast(ttl, []);
  const l = await s.acquire("k");
  const held = [{ key: "k", token: l.token }];

  // A's next heartbeat goes unanswered for the stall bound: the client moves to B.
  const before = a.sent.length;
  clock.advance(interval);
  await flush();
  assert.ok(a.sent.length > before, "no heartbeat on A within an interval");
  clock.advance(stallAfter(interval));
  await flush();
  assert.equal(api.streams.length, 2, "the client did not move after the stall bound");
  const b = api.stream;
  assert.ok(b.sent.length > 0, "no heartbeat on B at the move");
  const moved = clock.now();
  // A answers now, at the instant of the move.
  a.answerLast(ttl, held);

  // B answers nothing for more than a TTL; A answers every heartbeat it is sent.
  for (let i = 0; i < 12; i++) {
    const n = a.sent.length;
    clock.advance(interval);
    await flush();
    assert.ok(s.valid() && l.valid(), `step ${i}: lost ${clock.now() - moved} ms after the move: ${s.err ?? l.err}`);
    assert.ok(a.sent.length > n, `step ${i}: no heartbeat sent on A ${clock.now() - moved} ms after the move`);
    assert.equal(a.sent[a.sent.length - 1]!.req.ack.length, 0, "an acknowledgement sent on the stalled stream");
    a.answerLast(ttl, held);
  }
  assert.ok(l.deadline > moved + ttl, `lock deadline ${l.deadline - moved} ms after the move: want beyond the TTL`);

  // B answers: A is sent nothing more, and its stream is cut once nothing is in flight there.
  b.answerLast(ttl, held);
  const n = a.sent.length;
  clock.advance(interval);
  await flush();
  assert.equal(a.sent.length, n, "a heartbeat sent on A after B answered");
  assert.ok(a.cancelled, "A's stream not cut after B answered and nothing was in flight on A");
  assert.ok(s.valid() && l.valid(), `lost after B answered: ${s.err ?? l.err}`);
  await client.close();
});

/** A client moved from A to B on a stall; A's heartbeat in flight is not answered yet. */
async function stallMoved() {
  const ttl = 10_000;
  const interval = 1000;
  const clock = new FakeClock();
  const api = new FakeApi(clock, { ttlMs: ttl, marginMs: 500, intervalMs: interval, remainingMs: ttl });
  api.several = true;
  api.setAside = (peer: string) => {
    api.asides.push(peer);
    return api.asides.length === 1;
  };
  const client = new Client("fake:1", { api, clock, closeTimeoutMs: 100 });
  const s = await client.newSession();
  await flush();
  const a = api.stream;
  a.answerLast(ttl, []);
  const l = await s.acquire("k");
  clock.advance(interval);
  await flush();
  clock.advance(stallAfter(interval));
  await flush();
  assert.equal(api.streams.length, 2, "the client did not move after the stall bound");
  const b = api.stream;
  assert.ok(b.sent.length > 0, "no heartbeat on B at the move");
  return { ttl, interval, clock, client, s, l, a, b, held: [{ key: "k", token: l.token }] };
}

test("error answers and notices of the stream moved to do not stop the sends on the stalled stream", async () => {
  const { ttl, interval, clock, client, s, l, a, b, held } = await stallMoved();
  const moved = clock.now();
  a.answerLast(ttl, held); // A answers at the instant of the move
  for (let i = 0; i < 12; i++) {
    // B answers its last heartbeat with an error, and sends a notice: neither shows that B keeps the session.
    const last = b.sent[b.sent.length - 1]!;
    b.reply({ sessionId: last.req.sessionId, requestId: last.req.requestId, live: true,
      error: { code: 14, reason: "UNAVAILABLE", message: "backend unavailable" } });
    b.reply({ sessionId: last.req.sessionId, live: true });
    const n = a.sent.length;
    clock.advance(interval);
    await flush();
    assert.ok(s.valid() && l.valid(), `step ${i}: lost ${clock.now() - moved} ms after the move: ${s.err ?? l.err}`);
    assert.ok(a.sent.length > n, `step ${i}: no heartbeat sent on A ${clock.now() - moved} ms after the move (B answers errors)`);
    a.answerLast(ttl, held);
  }
  assert.ok(l.deadline > moved + ttl, `lock deadline ${l.deadline - moved} ms after the move: want beyond the TTL`);
  b.answerLast(ttl, held); // B's first live answer stops them
  const n = a.sent.length;
  clock.advance(interval);
  await flush();
  assert.equal(a.sent.length, n, "a heartbeat sent on A after B answered live");
  await client.close();
});

test("a heartbeat unanswered on the stalled stream is forgotten a TTL after its send, and the next one sent there", async () => {
  const { interval, clock, client, s, a } = await stallMoved();
  const moved = clock.now();
  const n0 = a.sent.length; // A answers nothing from now on, nor does B; grants keep the session
  for (let i = 0; i < 25; i++) {
    await s.acquire(`x${i}`); // a grant's answer extends the session (C2 #ct2-deadline)
    clock.advance(interval);
    await flush();
    assert.ok(s.valid(), `step ${i}: session lost ${clock.now() - moved} ms after the move: ${s.err}`);
  }
  assert.ok(a.sent.length >= n0 + 2,
    `${clock.now() - moved} ms after the move, ${a.sent.length - n0} heartbeat(s) sent on the stalled stream that answers nothing; want 2 (each forgotten a TTL after its send, the next sent)`);
  await client.close();
});
