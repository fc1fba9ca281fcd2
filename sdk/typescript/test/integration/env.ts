// The lockd the integration tests run against: started by the Go harness
// (test/sdk, TestTypeScriptSDK), which passes its address in the environment.
import { Client, type ClientOptions } from "../../src/index.js";

/** The value of an environment variable the harness sets; a test run without it fails (never skips). */
export function need(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run these tests through the Go harness (go test -run TestTypeScriptSDK ./test/sdk/)`);
  return v;
}

export const backend = () => need("LOCKDTEST_BACKEND");

/** A client of the harness's lockd, closed when the test ends. */
export function client(t: { after(fn: () => Promise<void> | void): void }, opts: ClientOptions = {}): Client {
  const c = new Client(need("LOCKDTEST_ADDR"), { backoffMinMs: 10, backoffMaxMs: 200, ...opts });
  t.after(() => c.close());
  return c;
}

let n = 0;
/** A key of its own for each test (the backend is shared by the tests of a row). */
export function key(name: string): string {
  return `ts/${process.pid}/${++n}/${name}`;
}

/** Polls cond until it holds or `within` ms pass (never a bare sleep as synchronisation). */
export async function eventually(within: number, what: string, cond: () => boolean | Promise<boolean>): Promise<void> {
  const end = performance.now() + within;
  for (;;) {
    if (await cond()) return;
    if (performance.now() > end) throw new Error(`not within ${within} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
