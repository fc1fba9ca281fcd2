// A `lockd bench` worker on the TypeScript SDK: one cell of the distinct
// scenario measured through this SDK in a process of its own, so that the
// bench reports the SDK's figures as a ratio to the Go SDK's in the same run
// (issue 25; internal/bench sdk.go). Run as `node dist/test/benchworker.js`;
// not part of the npm package, not for use by hand.
//
// stdin: the bench's job, one JSON object (internal/bench workerJob): system
// "lockd", scenario "distinct", c clients, the window's duration in
// nanoseconds, a tag that makes the keys unique, lockd's address. stdout: one
// JSON object (workerResult): ops (pairs in the window), elapsed and every
// pair's latency in nanoseconds, pairs per client, the process's CPU time in
// the window (cpu_ns.client); or error. The load is the
// Go bench's distinctLoad: one Client, a session per simulated client, each
// acquiring and releasing keys of its own (tag/cN/kI, 16 per client) one pair
// after another for a warm-up of a fifth of the window (at most a second, on
// keys of their own), then for the window, which ends when the last client
// finished its last pair. The simulated clients are async loops on one event
// loop.
import { Client, type Session } from "../src/index.js";

const KEYS_PER_CLIENT = 16; // internal/bench keysPerClient

interface Job {
  system?: string;
  scenario?: string;
  c?: number;
  duration?: number;
  tag?: string;
  lockd_addr?: string;
}

/** distinctLoad: every session's pairs for durMs; the first error ends all. */
async function load(sessions: Session[], durMs: number, tag: string): Promise<Record<string, unknown>> {
  const deadline = performance.now() + durMs;
  const lats: number[][] = sessions.map(() => []);
  let failed: Error | undefined;
  const start = process.hrtime.bigint();
  const cpu0 = process.cpuUsage();
  await Promise.all(sessions.map(async (s, ci) => {
    const prefix = `${tag}/c${ci}/k`;
    let i = 0;
    try {
      for (; failed === undefined && performance.now() < deadline; i++) {
        const t0 = process.hrtime.bigint();
        const l = await s.acquire(prefix + (i % KEYS_PER_CLIENT));
        await l.release();
        lats[ci]!.push(Number(process.hrtime.bigint() - t0));
      }
    } catch (e) {
      failed ??= new Error(`client ${ci}, pair ${i}: ${(e as Error).message}`);
    }
  }));
  const elapsed = Number(process.hrtime.bigint() - start);
  const cpu = process.cpuUsage(cpu0);
  if (failed) throw failed;
  return {
    ops: lats.reduce((n, x) => n + x.length, 0), elapsed, lat: lats.flat(), per_client: lats.map((x) => x.length),
    cpu_ns: { client: (cpu.user + cpu.system) * 1000 },
  };
}

async function run(job: Job): Promise<Record<string, unknown>> {
  if (job.system !== "lockd" || job.scenario !== "distinct") {
    throw new Error(`the TypeScript SDK's worker measures lockd's distinct scenario, not ${job.system} ${job.scenario}`);
  }
  const c = job.c ?? 0, durMs = (job.duration ?? 0) / 1e6, tag = job.tag ?? "";
  if (!(c >= 1) || !(durMs > 0) || !job.lockd_addr) throw new Error(`c=${c}, duration ${durMs} ms, lockd ${job.lockd_addr}: want all`);
  const client = new Client(job.lockd_addr);
  try {
    const sessions = await Promise.all(Array.from({ length: c }, () => client.newSession()));
    const warm = Math.min(durMs / 5, 1000);
    if (warm > 0) await load(sessions, warm, tag + "-warm");
    return await load(sessions, durMs, tag);
  } finally {
    await client.close(); // closes the sessions, best effort
  }
}

async function main(): Promise<number> {
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  let res: Record<string, unknown>, code = 0;
  try {
    res = await run(JSON.parse(input) as Job);
  } catch (e) {
    res = { error: `typescript sdk: ${(e as Error).message}` };
    code = 1;
  }
  await new Promise<void>((resolve) => process.stdout.write(JSON.stringify(res) + "\n", () => resolve()));
  return code;
}

main().then((code) => process.exit(code));
