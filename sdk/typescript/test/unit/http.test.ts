// The HTTP transport (src/http.ts, C2 #ct2-http) under the fake clock: the
// session kept alive by Heartbeat calls follows the timing rules of the gRPC
// path (C2 #ct2-deadline, #ct2-sdk) — the deadline from each call's send
// time, the next heartbeat halfway to a short deadline, an error answer that
// never extends trust, notices acknowledged on the next call — with the real
// HttpApi (routes, JSON, errors) over a fake HttpTransport.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "../../src/client.js";
import { HttpApi, type HttpReply, type HttpTransport } from "../../src/http.js";
import { LockLostError } from "../../src/errors.js";
import { FakeClock, flush, type FakeConfig } from "./fake.js";

/** A Heartbeat call at the fake server, answered when the test says. */
interface Beat {
  at: number;
  path: string;
  body: Record<string, unknown>;
  answer(r: HttpReply): void;
}

class FakeHttp implements HttpTransport {
  beats: Beat[] = [];
  paths: string[] = [];
  bodies: string[] = [];
  private token = 100;
  constructor(private readonly clock: FakeClock, public cfg: FakeConfig) {}
  get last(): Beat {
    return this.beats[this.beats.length - 1]!;
  }
  send(_addr: string, verb: string, path: string, body: string | undefined): Promise<HttpReply> {
    this.paths.push(`${verb} ${path}`);
    this.bodies.push(body ?? "");
    const ok = (v: unknown) => Promise.resolve({ status: 200, body: JSON.stringify(v) });
    if (path === "/v1/sessions") {
      this.cfg.duringOpen?.();
      return ok({ session_id: "S/1", session_secret: "AQID", ttl_ms: String(this.cfg.ttlMs), remaining_ms: String(this.cfg.remainingMs),
        safety_margin_ms: String(this.cfg.marginMs), heartbeat_interval_ms: String(this.cfg.intervalMs) });
    }
    if (path.endsWith(":keepalive")) {
      return new Promise((resolve) => this.beats.push({ at: this.clock.now(), path, body: JSON.parse(body!) as Record<string, unknown>, answer: resolve }));
    }
    if (path.endsWith(":acquire")) {
      this.cfg.duringAcquire?.();
      const key = decodeURIComponent(path.slice("/v1/locks/".length, -":acquire".length));
      return ok({ granted: true, key, token: String(++this.token), remaining_ms: String(this.cfg.remainingMs) });
    }
    return ok({});
  }
  stream(): void {
    throw new Error("not in the fake");
  }
  /** Answers the last Heartbeat call: live, with remaining and the held set given. */
  answerLast(remainingMs: number, held: { key: string; token: bigint }[], lost: unknown[] = [], b: Beat = this.last): Beat {
    b.answer({ status: 200, body: JSON.stringify({ live: true, remaining_ms: String(remainingMs), draining: false, lost,
      held: { locks: held.map((h) => ({ key: h.key, token: String(h.token) })) } }) });
    return b;
  }
}

function setup(cfg: FakeConfig) {
  const clock = new FakeClock();
  const fake = new FakeHttp(clock, cfg);
  const api = new HttpApi({ addresses: ["127.0.0.1:1"], transport: fake, now: () => clock.now() });
  const client = new Client("127.0.0.1:1", { api, clock, closeTimeoutMs: 100 });
  return { clock, fake, client };
}

test("over HTTP: the deadline counts from each call's send time, not its answer's arrival (TestDeadlineFromSendTime)", async () => {
  const rtt = 1000;
  const rem = 10_000;
  const margin = 500;
  const { clock, fake, client } = setup({ ttlMs: 60_000, marginMs: margin, intervalMs: 2000, remainingMs: rem });
  fake.cfg.duringOpen = () => clock.advance(rtt);
  const t0 = clock.now();
  const s = await client.newSession();
  assert.equal(s.deadline - t0, rem - margin, "deadline after OpenSession: want send + Remaining − margin");
  // The first Heartbeat call goes at once; its answer arrives rtt later.
  await flush();
  const first = fake.last;
  assert.equal(first.path, "/v1/sessions/S%2F1:keepalive");
  assert.deepEqual(first.body, { session_secret: "AQID" }, "the session id goes in the path only");
  clock.advance(rtt);
  fake.answerLast(rem, []);
  await flush();
  assert.equal(s.deadline - t0, first.at - t0 + rem - margin, "deadline after the Heartbeat call: want its send + Remaining − margin");
  // A later heartbeat, answered after rtt, moves the deadline to its own send time.
  clock.advance(2000);
  await flush();
  const second = fake.last;
  assert.notEqual(second, first, "no heartbeat an interval later");
  clock.advance(rtt);
  fake.answerLast(rem, [], [], second);
  await flush();
  assert.equal(s.deadline, second.at + rem - margin, "deadline after the second Heartbeat call");

  fake.cfg.duringAcquire = () => clock.advance(rtt);
  const sent = clock.now();
  const l = await s.acquire("jobs/a:b c");
  assert.ok(fake.paths.includes("POST /v1/locks/jobs/a%3Ab%20c:acquire"), fake.paths.join("\n"));
  assert.equal(l.deadline, sent + rem - margin, "lock deadline after the Acquire call");
  await client.close();
});

test("over HTTP: an answer that leaves less than an interval brings the next Heartbeat call halfway to the deadline (TestHeartbeatBeforeShortDeadline)", async () => {
  const rem = 1200;
  const margin = 500;
  const window = rem - margin;
  const { clock, fake, client } = setup({ ttlMs: 3000, marginMs: margin, intervalMs: 1000, remainingMs: rem });
  const s = await client.newSession();
  await flush();
  fake.answerLast(rem, []);
  await flush();
  const l = await s.acquire("k");
  for (let i = 0; i < 8; i++) {
    const before = fake.beats.length;
    clock.advance(window / 2);
    await flush();
    assert.ok(fake.beats.length > before, `step ${i}: no Heartbeat call within ${window / 2} ms of an answer that left ${window} ms`);
    const b = fake.answerLast(rem, [{ key: "k", token: l.token }]);
    await flush();
    assert.equal(l.deadline, b.at + window, `step ${i}: lock deadline`);
    assert.ok(l.valid(), `step ${i}: lock lost: ${l.err}`);
  }
  await client.close();
});

test("over HTTP: an error answer never extends trust and brings a retry within half an interval; a notice is applied and acknowledged on the next call", async () => {
  const rem = 10_000;
  const { clock, fake, client } = setup({ ttlMs: 15_000, marginMs: 2000, intervalMs: 5000, remainingMs: rem });
  const s = await client.newSession();
  await flush();
  fake.answerLast(rem, []);
  await flush();
  const l = await s.acquire("k");
  const deadline = s.deadline;
  clock.advance(5000);
  await flush();
  fake.last.answer({ status: 503, body: JSON.stringify({ code: 14, message: "backend down", reason: "UNAVAILABLE", details: [] }) });
  await flush();
  assert.equal(s.deadline, deadline, "an error answer extended the deadline");
  assert.ok(s.valid() && l.valid());
  const before = fake.beats.length;
  clock.advance(1000); // min(interval/2, 1 s)
  await flush();
  assert.ok(fake.beats.length > before, "no retry within 1 s of an error answer");
  // The answer carries a lock-lost notice: the lock ends, the next call acknowledges it.
  fake.answerLast(rem, [], [{ key: "k", token: String(l.token), reason: "LOCK_LOST_REASON_REVOKED", notice_id: "7" }]);
  await flush();
  assert.ok(l.err instanceof LockLostError, `lock not lost: ${l.err}`);
  assert.deepEqual(fake.last.body, { session_secret: "AQID", ack: ["7"] }, "the notice was not acknowledged at once");
  await client.close();
});
