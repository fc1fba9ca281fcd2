// The timing rules of C2 #ct2-deadline and #ct2-confirm under a fake clock:
// the TypeScript equivalents of the Go SDK's TestDeadlineFromSendTime,
// TestHeartbeatBeforeShortDeadline, TestLostNoticeRedelivered and
// TestRevokeWithoutNoticeEndsTrust, and the other rules every SDK follows.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "../../src/client.js";
import { InvalidArgumentError, LockLostError, MaxHoldError, SessionExpiredError } from "../../src/errors.js";
import { LockLostReason } from "../../src/gen/lockd/v1/lockd_pb.js";
import { FakeApi, FakeClock, flush, type FakeConfig } from "./fake.js";

function setup(cfg: FakeConfig) {
  const clock = new FakeClock();
  const api = new FakeApi(clock, cfg);
  const client = new Client("fake:1", { api, clock, closeTimeoutMs: 100 });
  return { clock, api, client };
}

test("deadline counts from the send time, not the reply's arrival (TestDeadlineFromSendTime)", async () => {
  const rtt = 1000; // how far the clock moves while a request is at the server
  const rem = 10_000;
  const margin = 500;
  const { clock, api, client } = setup({ ttlMs: 60_000, marginMs: margin, intervalMs: 2000, remainingMs: rem });
  api.cfg.duringOpen = () => clock.advance(rtt);
  const t0 = clock.now();
  const s = await client.newSession();
  assert.equal(s.deadline - t0, rem - margin, "deadline after OpenSession sent at t0, answered at t0+rtt: want send + Remaining − margin");

  // The new stream sends the first heartbeat at once (t0+rtt); it is answered rtt later.
  await flush();
  const first = api.stream.sent[0]!;
  assert.equal(first.at - t0, rtt);
  clock.advance(rtt);
  api.stream.answerLast(rem, []);
  assert.equal(s.deadline - t0, first.at - t0 + rem - margin, "deadline after the heartbeat: want its send + Remaining − margin");

  // An Acquire that spends rtt at the server.
  api.cfg.duringAcquire = () => clock.advance(rtt);
  const sent = clock.now();
  const l = await s.acquire("k");
  assert.equal(clock.now() - sent, rtt);
  assert.equal(s.deadline - t0, sent - t0 + rem - margin, "deadline after the Acquire: want its send + Remaining − margin");
  assert.equal(l.deadline - t0, sent - t0 + rem - margin, "lock deadline after the Acquire");
  await client.close();
});

test("an answer that leaves less than an interval brings the next heartbeat halfway to the deadline (TestHeartbeatBeforeShortDeadline)", async () => {
  const rem = 1200;
  const margin = 500;
  const window = rem - margin; // 700 ms of trust per answer
  const { clock, api, client } = setup({ ttlMs: 3000, marginMs: margin, intervalMs: 1000, remainingMs: rem });
  const s = await client.newSession();
  await flush();
  api.stream.answerLast(rem, []);
  const l = await s.acquire("k");
  for (let i = 0; i < 8; i++) { // 8 × 350 ms: four windows
    const now = clock.now();
    const before = api.stream.sent.length;
    clock.advance(window / 2);
    await flush();
    assert.ok(api.stream.sent.length > before,
      `step ${i}: no heartbeat within ${window / 2} ms of an answer that left a ${window} ms window (lock deadline now+${l.deadline - now})`);
    const b = api.stream.answerLast(rem, [{ key: "k", token: l.token }]);
    assert.equal(l.deadline, b.at + window, `step ${i}: lock deadline`);
    assert.ok(l.valid(), `step ${i}: lock lost: ${l.err}`);
  }
  await client.close();
});

test("a lock-lost notice repeated on a new stream ends the lock and is acknowledged there (TestLostNoticeRedelivered)", async () => {
  const { clock, api, client } = setup({ ttlMs: 15_000, marginMs: 2000, intervalMs: 5000, remainingMs: 15_000 });
  const s = await client.newSession();
  await flush();
  api.stream.answerLast(15_000, []);
  const l = await s.acquire("k");
  // The server's push of the notice is lost with the connection.
  const st1 = api.stream;
  st1.fail();
  clock.advance(0);
  await flush();
  const st2 = api.stream;
  assert.notEqual(st2, st1, "no new stream after the first broke");
  assert.equal(st2.sent.length, 1, "the new stream's first heartbeat");
  // The notice is still pending on the server: pushed on the new stream.
  st2.reply({ sessionId: s.id, requestId: 0n, live: true, lost: [{ key: "k", token: l.token, reason: LockLostReason.REVOKED, noticeId: 7n }] });
  assert.ok(l.err instanceof LockLostError, `lock error ${l.err}; want LockLostError`);
  assert.ok(l.signal.aborted, "lock signal not aborted");
  assert.ok(s.valid(), `session ended (${s.err}); want only the lock lost`);
  // Acknowledged at once, on the stream it came on.
  clock.advance(0);
  await flush();
  const last = st2.sent[st2.sent.length - 1]!;
  assert.deepEqual(last.req.ack, [7n], "the heartbeat after the notice does not acknowledge it");
  assert.equal(st1.sent.some((x) => x.req.ack.length > 0), false, "an ack went to the old stream");
  await client.close();
});

test("an answer whose held set omits a lock ends that lock only (TestRevokeWithoutNoticeEndsTrust)", async () => {
  const rem = 10_000;
  const margin = 500;
  const { clock, api, client } = setup({ ttlMs: 15_000, marginMs: margin, intervalMs: 1000, remainingMs: rem });
  const s = await client.newSession();
  await flush();
  api.stream.answerLast(rem, []);
  const revoked = await s.acquire("revoked");
  const kept = await s.acquire("kept");
  const before = api.stream.sent.length;
  clock.advance(1000); // the next heartbeat (a jittered interval)
  await flush();
  assert.ok(api.stream.sent.length > before, "no heartbeat within an interval");
  // No notice ever arrives; the answer lists only the lock that stands.
  const b = api.stream.answerLast(rem, [{ key: "kept", token: kept.token }]);
  assert.ok(revoked.err instanceof LockLostError, `revoked lock: err ${revoked.err}; want LockLostError`);
  assert.equal(revoked.valid(), false);
  assert.ok(kept.valid(), `kept lock lost: ${kept.err}`);
  assert.equal(kept.deadline, b.at + rem - margin, "kept lock extended by the answer that lists it");
  assert.equal(s.deadline, b.at + rem - margin, "session extended");
  await client.close();
});

test("an answer that omits a lock granted with maxHoldMs ends it with MaxHoldError once the clock reads its Acquire's send time plus maxHoldMs, LockLostError before (TestOmittedPastMaxHoldIsErrMaxHold)", async () => {
  // C2 #ct2-maxhold-sdk (MAXHOLD-1): no lock-lost notice arrives (as when the
  // server's held set saw the backend's revoke before its lock-loss watch made
  // the notice); the SDK names the cause from its own clock. Before the rule
  // both locks ended with plain LockLostError.
  const hold = 600_000;
  const rem = 3_600_000; // every answer's Remaining: the session outlives the fake hour
  const { clock, api, client } = setup({ ttlMs: 60_000, marginMs: 500, intervalMs: 1000, remainingMs: rem });
  const s = await client.newSession();
  await flush();
  api.stream.answerLast(rem, []);
  const t0 = clock.now(); // the send time of both Acquires: the fake clock does not move in them
  const early = await s.acquire("early", { maxHoldMs: hold });
  const late = await s.acquire("late", { maxHoldMs: hold });
  assert.equal(clock.now(), t0);

  // The control: omitted 1 ms before t0 + maxHoldMs, the hold cannot be why.
  let before = api.stream.sent.length;
  clock.advance(hold - 1);
  await flush();
  assert.ok(api.stream.sent.length > before, "no heartbeat while the clock moved");
  api.stream.answerLast(rem, [{ key: "late", token: late.token }]);
  assert.ok(early.err instanceof LockLostError && !(early.err instanceof MaxHoldError),
    `lock omitted at t0 + ${clock.now() - t0} ms, before its maximum hold could end it: err ${early.err}; want LockLostError, not MaxHoldError`);
  assert.ok(late.valid(), `late lock lost before an answer omitted it: ${late.err}`);

  // Omitted at or past t0 + maxHoldMs: MaxHoldError, which is a LockLostError too.
  before = api.stream.sent.length;
  clock.advance(1000); // the next heartbeat goes at t0 + maxHoldMs − 1 ms + 1 s at the latest
  await flush();
  assert.ok(api.stream.sent.length > before, "no heartbeat within an interval");
  api.stream.answerLast(rem, []);
  assert.ok(late.err instanceof MaxHoldError && late.err instanceof LockLostError,
    `lock omitted at t0 + ${clock.now() - t0} ms, past its maximum hold ${hold} ms, no notice: err ${late.err}; want MaxHoldError`);
  assert.equal(s.err, undefined, "session ended; want only the locks lost");
  await client.close();
});

test("trust ends at the deadline when no answer comes, and the session is closed on the server", async () => {
  const rem = 3000;
  const margin = 500;
  const { clock, api, client } = setup({ ttlMs: 3000, marginMs: margin, intervalMs: 1000, remainingMs: rem });
  const t0 = clock.now();
  const s = await client.newSession();
  const l = await s.acquire("k");
  await flush();
  clock.advance(rem - margin - 1); // heartbeats go out; none is answered
  assert.ok(l.valid(), "lock not trusted before its deadline");
  clock.advance(1);
  assert.equal(clock.now() - t0, rem - margin);
  assert.ok(l.signal.aborted, "lock signal not aborted at the deadline");
  assert.ok(s.err instanceof SessionExpiredError, `session error ${s.err}`);
  assert.equal(l.valid(), false);
  await flush();
  assert.ok(api.stream.cancelled, "KeepAlive stream kept open without sessions");
  await client.close();
});

test("an answer without a lock never extends it; an answer that lists a grant no lock knows releases it", async () => {
  const rem = 10_000;
  const { clock, api, client } = setup({ ttlMs: 15_000, marginMs: 500, intervalMs: 1000, remainingMs: rem });
  const s = await client.newSession();
  await flush();
  api.stream.answerLast(rem, [{ key: "orphan", token: 5n }]);
  await flush();
  assert.deepEqual(api.releases.map((r) => [r.key, r.token]), [["orphan", 5n]], "unclaimed grant not released");
  // An error answer (transient backend trouble) extends nothing.
  const l = await s.acquire("k");
  const d = l.deadline;
  clock.advance(1000);
  await flush();
  const last = api.stream.sent[api.stream.sent.length - 1]!;
  api.stream.reply({ sessionId: s.id, requestId: last.req.requestId, error: { code: 14, reason: "UNAVAILABLE", message: "blip" } });
  assert.equal(l.deadline, d, "an error answer moved the lock's deadline");
  assert.ok(l.valid());
  await client.close();
});

test("a safety margin or heartbeat interval the TTL cannot carry is refused", async () => {
  const clock = new FakeClock();
  const api = new FakeApi(clock, { ttlMs: 3000, marginMs: 500, intervalMs: 1000, remainingMs: 3000 });
  assert.throws(() => new Client("fake:1", { api, clock, ttlMs: 3000, safetyMarginMs: 1500 }), InvalidArgumentError);
  assert.throws(() => new Client("fake:1", { api, clock, ttlMs: 3000, safetyMarginMs: 500, heartbeatIntervalMs: 2500 }), InvalidArgumentError);
  assert.throws(() => new Client("fake:1", { api, clock, heartbeatIntervalMs: 50 }), InvalidArgumentError);
  // The server's TTL against the client's margin: checked once the session's TTL is known.
  const c = new Client("fake:1", { api, clock, safetyMarginMs: 1500, closeTimeoutMs: 100 });
  await assert.rejects(c.newSession(), InvalidArgumentError);
  // The server's own interval must leave time inside the trust window.
  api.cfg.intervalMs = 2600;
  const c2 = new Client("fake:1", { api, clock, closeTimeoutMs: 100 });
  await assert.rejects(c2.newSession(), InvalidArgumentError);
  await c.close();
  await c2.close();
});

test("a lock granted after a heartbeat was sent is neither lost nor extended by its answer", async () => {
  const rem = 10_000;
  const margin = 500;
  const { clock, api, client } = setup({ ttlMs: 15_000, marginMs: margin, intervalMs: 5000, remainingMs: rem });
  const s = await client.newSession();
  await flush();
  const beat = api.stream.sent[0]!; // in flight
  clock.advance(100);
  const granted = clock.now();
  const l = await s.acquire("k");
  assert.equal(l.deadline, granted + rem - margin);
  // The answer was composed before the grant: it does not list the lock, and grants more time.
  api.stream.answerLast(rem + 5000, []);
  assert.equal(s.deadline, beat.at + rem + 5000 - margin, "session extended");
  assert.ok(l.valid(), `lock added after the heartbeat's send was ended: ${l.err}`);
  assert.equal(l.deadline, granted + rem - margin, "lock extended by an answer that does not list it");
  await client.close();
});
