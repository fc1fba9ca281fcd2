// A silent watch stream (C2 #ct2-watch-progress) under a fake clock: with
// several addresses, a stream that has given nothing for three progress
// intervals is given up, its replica set aside, and the watch resumed from
// its cursor; with one address it is kept.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "../../src/client.js";
import { EventKind } from "../../src/gen/lockd/v1/lockd_pb.js";
import { FakeApi, FakeClock, flush } from "./fake.js";

async function start(several: boolean) {
  const clock = new FakeClock();
  const api = new FakeApi(clock, { ttlMs: 3000, marginMs: 500, intervalMs: 1000, remainingMs: 3000 });
  api.several = several;
  const client = new Client("fake:1", { api, clock, backoffMinMs: 10, backoffMaxMs: 10 });
  const ac = new AbortController();
  const opened = client.watch("p/", { signal: ac.signal });
  await flush();
  // Established: the first progress, with the start cursor and the interval.
  api.watches[0]!.send({ kind: EventKind.PROGRESS, cursor: "c0", progressIntervalMs: 1000n });
  const it = (await opened)[Symbol.asyncIterator]();
  return { clock, api, client, ac, it };
}

test("a watch stream silent for three progress intervals moves to another replica and resumes from its cursor", async () => {
  const { clock, api, client, ac, it } = await start(true);
  const first = api.watches[0]!;
  first.send({ kind: EventKind.ACQUIRED, key: "p/a", cursor: "c1" });
  assert.equal((await it.next()).value?.key, "p/a");
  const next = it.next(); // waiting: the silence counts
  clock.advance(2999);
  await flush();
  assert.equal(first.cancelled, false, "stream given up before its silence bound");
  clock.advance(1);
  await flush();
  assert.ok(first.cancelled, "silent stream kept");
  assert.deepEqual(api.asides, [first.peer]);
  clock.advance(10); // the backoff
  await flush();
  const second = api.watches[1];
  assert.ok(second, "no new stream");
  assert.equal(second.req.resumeAfter, "c1", "not resumed from the last cursor");
  second.send({ kind: EventKind.PROGRESS, cursor: "c1", progressIntervalMs: 1000n });
  second.send({ kind: EventKind.RELEASED, key: "p/a", cursor: "c2" });
  assert.equal((await next).value?.kind, "released");
  ac.abort();
  await client.close();
});

test("with one address a silent watch stream is kept", async () => {
  const { clock, api, client, ac, it } = await start(false);
  const next = it.next();
  clock.advance(10_000);
  await flush();
  assert.equal(api.watches[0]!.cancelled, false, "the only replica's stream was given up");
  assert.equal(api.watches.length, 1);
  ac.abort();
  await next;
  await client.close();
});
