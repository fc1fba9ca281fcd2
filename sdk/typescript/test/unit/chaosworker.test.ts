// The chaos worker's plumbing (test/chaosworker_impl.ts), without lockd: the Go
// worker's flags and durations, and history lines as package history reads
// them (test/chaos/history: the exact int64 epoch, tokens, omitted empty
// fields). The worker itself runs in `make chaos-typescript`.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { HistoryClock, parseArgs, parseDuration, Recorder, wallAt } from "../chaosworker_impl.js";

test("Go durations parse to milliseconds", () => {
  assert.equal(parseDuration("0s"), 0);
  assert.equal(parseDuration("0"), 0);
  assert.equal(parseDuration("80ms"), 80);
  assert.equal(parseDuration("1m30s"), 90_000);
  assert.equal(parseDuration("1.5s"), 1500);
  assert.equal(parseDuration("250us"), 0.25);
  assert.equal(parseDuration("-2s"), -2000);
  assert.throws(() => parseDuration("5"), /invalid duration/);
  assert.throws(() => parseDuration("1x"), /invalid duration/);
});

test("the Go worker's flags", () => {
  const cfg = parseArgs(["-proc", "w3", "-lockd=127.0.0.1:1,127.0.0.1:2", "-fenced", "http://127.0.0.1:9", "-history", "/h",
    "-keys", "a,b", "-ttl", "3s", "-hold-min", "10ms", "-hold-max", "40ms", "-clock-scale", "0.85", "-trust", "receive-ttl",
    "-heartbeat-interval", "200ms", "-seed", "7", "-hold-ack", "-rw", "-pairs=false"]);
  assert.deepEqual(cfg, {
    proc: "w3", lockd: ["127.0.0.1:1", "127.0.0.1:2"], fenced: "http://127.0.0.1:9", history: "/h", keys: ["a", "b"],
    ttl: 3000, holdMin: 10, holdMax: 40, clockScale: 0.85, trust: "receive-ttl", limit: 0, rw: true,
    heartbeatInterval: 200, seed: 7, holdAck: true,
  });
  assert.throws(() => parseArgs(["-proc", "w0"]), /at least one lockd address/);
  assert.throws(() => parseArgs(["-nope", "1"]), /not defined: -nope/);
  assert.throws(() => parseArgs(["-proc", "w0", "-lockd", "a:1", "-fenced", "f", "-history", "h", "-keys", "k", "-limit", "3", "-rw"]),
    /a semaphore or a read\/write lock/);
  assert.throws(() => parseArgs(["-proc", "w0", "-lockd", "a:1", "-fenced", "f", "-history", "h", "-keys", "k", "-pairs"]),
    /the Go worker's only/);
});

test("history lines as package history reads them", () => {
  const dir = mkdtempSync(join(tmpdir(), "tschaos-"));
  try {
    const path = join(dir, "w0.jsonl");
    const epoch = BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6)) - 1_000_000_000n + 123n;
    const rec = new Recorder(path, "w0", new HistoryClock(epoch));
    let c = rec.invoke("open", "k");
    rec.complete(c, "ok");
    c = rec.invoke("acquire", "k", 0n, "shared");
    rec.complete(c, "ok", 7n);
    c = rec.invoke("write", "k", 7n, "shared");
    rec.complete(c, "fail", 0n, "fenced: stale token");
    rec.lost("k", 7n, rec.clock.now(), "why");
    rec.invoke("release", "k", 7n);
    assert.equal(rec.close(), undefined);
    assert.throws(() => new Recorder(path, "w0", new HistoryClock(epoch)), /EEXIST/); // O_EXCL: never two writers
    const text = readFileSync(path, "utf8");
    assert.match(text.split("\n")[0]!, new RegExp(`"epoch":${epoch}}$`)); // the int64 exactly
    const lines = text.trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>);
    assert.deepEqual(lines.map((l) => [l["ev"], l["seq"], l["kind"], l["token"] ?? "", l["mode"] ?? "", l["outcome"]].join(":")), [
      "start:0::::", "invoke:1:open:::", "complete:1:open:::ok", "invoke:2:acquire::shared:", "complete:2:acquire:7::ok",
      "invoke:3:write:7:shared:", "complete:3:write:::fail", "op:4:lost:7::ok", "invoke:5:release:7::",
    ]);
    const start = lines[0]!["invoke"] as number;
    // About a second after the epoch (the test's own reading of the clock).
    assert.ok(start > 0.9e9 && start < 60e9, `start at ${start} ns after the epoch`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the history clock reads the wall clock at its tick (not performance.timeOrigin)", () => {
  // A fake wall clock that ticks every 1 ms of a fake monotonic clock, at
  // monotonic 0.4 + k ms, where the wall clock reads 1000 + k ms exactly; each
  // reading advances the monotonic clock by 0.01 ms.
  let mono = 0;
  const monoNow = () => (mono += 0.01);
  const wallNow = () => 1000 + Math.floor(mono - 0.4);
  const [wallNs, at] = wallAt(wallNow, monoNow);
  const exact = BigInt(Math.round((1000 + (at - 0.4)) * 1e6)); // the fake wall clock's true value at `at`
  assert.ok(wallNs - exact < 20_000n && exact - wallNs < 20_000n, `wall ${wallNs} ns at ${at} ms; true ${exact} ns`);
  // The real clocks: the history clock agrees with Date.now() to a millisecond.
  const epoch = BigInt(Date.now() - 5000) * 1_000_000n;
  const hc = new HistoryClock(epoch);
  for (let i = 0; i < 5; i++) {
    const before = Date.now(), t = hc.now(), after = Date.now() + 1; // Date.now() truncates
    const lo = Number(BigInt(before) * 1_000_000n - epoch), hi = Number(BigInt(after) * 1_000_000n - epoch);
    assert.ok(t >= lo && t <= hi, `history time ${t} ns outside the wall clock's [${lo}, ${hi}]`);
  }
});
