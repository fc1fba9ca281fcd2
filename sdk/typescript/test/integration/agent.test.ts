// The JSON-lines agent (test/agent.ts) driven as another process would drive
// it, against the harness's lockd: outcomes are the Go SDK's sentinel names.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { key, need } from "./env.js";

type Msg = Record<string, unknown>;

function startAgent() {
  const child = spawn(process.execPath, [fileURLToPath(new URL("../agent.js", import.meta.url))], { stdio: ["pipe", "pipe", "inherit"] });
  const replies = new Map<number, (m: Msg) => void>();
  const events: Msg[] = [];
  let onEvent = () => {};
  createInterface({ input: child.stdout! }).on("line", (line) => {
    const m = JSON.parse(line) as Msg;
    if (typeof m.id === "number" && replies.has(m.id)) {
      replies.get(m.id)!(m);
      replies.delete(m.id);
    } else {
      events.push(m);
      onEvent();
    }
  });
  let n = 0;
  const call = (op: string, args: Msg = {}): { id: number; reply: Promise<Msg> } => {
    const id = ++n;
    const reply = new Promise<Msg>((r) => replies.set(id, r));
    child.stdin!.write(JSON.stringify({ id, op, ...args }) + "\n");
    return { id, reply };
  };
  const ask = (op: string, args: Msg = {}) => call(op, args).reply;
  const event = (pred: (m: Msg) => boolean) => new Promise<Msg>((resolve) => {
    const look = () => {
      const i = events.findIndex(pred);
      if (i >= 0) resolve(events.splice(i, 1)[0]!);
      else onEvent = look;
    };
    look();
  });
  const exited = new Promise<number | null>((r) => child.on("exit", r));
  return { call, ask, event, exited };
}

const outcome = (m: Msg) => (m.ok ? "ok" : String(m.error));

test("the agent runs a scenario with the Go SDK's outcome names", { timeout: 30_000 }, async () => {
  const a = startAgent();
  const { client } = await a.ask("client", { addresses: [need("LOCKDTEST_ADDR")] });
  const s1 = (await a.ask("session", { client, owner: "agent-1" })).session;
  const s2 = (await a.ask("session", { client })).session;
  const k = key("agent");
  const { watch } = await a.ask("watch", { client, prefix: k });
  const got: string[] = [];
  const l1 = await a.ask("acquire", { session: s1, key: k, value: "v" });
  got.push("acquire " + outcome(l1));
  got.push("watch " + String((await a.event((m) => m.event === "watch" && m.watch === watch)).kind));
  got.push("try_acquire " + outcome(await a.ask("try_acquire", { session: s2, key: k })));
  got.push("acquire-timeout " + outcome(await a.ask("acquire", { session: s2, key: k, timeout: 0.2 })));
  const waiting = a.call("acquire", { session: s2, key: k });
  await a.ask("cancel", { call: waiting.id }); // the agent registered the call before reading this line
  got.push("acquire-cancelled " + outcome(await waiting.reply));
  const info = await a.ask("inspect", { client, key: k });
  got.push(`inspect held=${info.held} owner=${info.owner} value=${info.value} token=${info.token === l1.token}`);
  got.push("revoke " + outcome(await a.ask("revoke", { client, key: k })));
  got.push("lost " + String((await a.event((m) => m.event === "lost" && m.lock === l1.lock)).error));
  got.push("release-after-loss " + outcome(await a.ask("release", { lock: l1.lock })));
  const l2 = await a.ask("acquire", { session: s2, key: k });
  got.push(`tokens-increase ${Number(l2.token) > Number(l1.token)}`);
  got.push("release " + outcome(await a.ask("release", { lock: l2.lock })));
  got.push("state " + String((await a.ask("lock_state", { lock: l2.lock })).error));
  got.push("quit " + outcome(await a.ask("quit")));
  assert.equal(await a.exited, 0);
  assert.deepEqual(got, [
    "acquire ok", "watch acquired", "try_acquire ErrLocked", "acquire-timeout ErrWaitTimeout",
    "acquire-cancelled context.Canceled", "inspect held=true owner=agent-1 value=v token=true", "revoke ok",
    "lost ErrLockLost", "release-after-loss ErrNotOwner", "tokens-increase true", "release ok", "state ErrReleased",
    "quit ok",
  ]);
});
