// Leader election on the exclusive lock, SetValue and Watch (C2 #ct2-election;
// the Go SDK's election.go).
import { create } from "@bufbuild/protobuf";
import { sleep } from "./clock.js";
import { LockLostError, NotOwnerError, retryable } from "./errors.js";
import { EventKind, InspectRequestSchema, WatchRequestSchema } from "./gen/lockd/v1/lockd_pb.js";
import { checkKey } from "./limits.js";
import type { Lock } from "./lock.js";
import type { Session } from "./session.js";
import type { Client } from "./client.js";
import { rawWatch } from "./watch.js";

/** The leader of an election, as observed. */
export interface Leader {
  session: string;
  owner: string;
  labels: Record<string, string>;
  value: Uint8Array;
  token: bigint;
}

/** This session's leadership of an election: the grant of the lock named like the election. */
export class Leadership {
  /** @internal */
  constructor(readonly lock: Lock) {}

  /** The election's name. */
  get name(): string {
    return this.lock.key;
  }

  /** The leader's fencing token, strictly increasing over successive leaders. */
  get token(): bigint {
    return this.lock.token;
  }

  /** Aborts exactly when the lock's would: stop acting as leader then. */
  get signal(): AbortSignal {
    return this.lock.signal;
  }

  /** Whether the leadership is trusted now. */
  valid(): boolean {
    return this.lock.valid();
  }

  /** Replaces the leader's value (same grant, same token). LockLostError if the leadership is gone; it never re-grants. */
  async proclaim(value: Uint8Array | string, opts: { signal?: AbortSignal } = {}): Promise<void> {
    try {
      await this.lock.setValue(value, opts);
    } catch (e) {
      if (e instanceof NotOwnerError) throw new LockLostError(`leadership lost: ${e.message}`, { cause: e });
      throw e;
    }
  }

  /** Gives up leadership: the first waiter becomes leader at once. */
  resign(opts: { signal?: AbortSignal } = {}): Promise<void> {
    return this.lock.release(opts);
  }
}

/** Session.campaign: waits in the election's queue; leadership is the grant. */
export async function campaign(s: Session, name: string, value: Uint8Array | string, opts: { signal?: AbortSignal }): Promise<Leadership> {
  return new Leadership(await s.acquire(name, { value, signal: opts.signal }));
}

function same(a: Leader | null, b: Leader | null): boolean {
  if (a === null || b === null) return a === b;
  return a.session === b.session && a.token === b.token && a.owner === b.owner &&
    Buffer.compare(Buffer.from(a.value), Buffer.from(b.value)) === 0 && JSON.stringify(a.labels) === JSON.stringify(b.labels);
}

/**
 * Client.observe: the current leader, then every change, from a watch of the
 * name (with holders) and one read once it is established; the key read
 * again after the watch is re-established or resyncs. Consecutive equal
 * observations are not repeated, and leaders' tokens only rise.
 */
export async function* observe(c: Client, name: string, o: { signal?: AbortSignal }): AsyncGenerator<Leader | null> {
  checkKey(name);
  const signal = o.signal ? AbortSignal.any([o.signal, c.signal]) : c.signal;
  let last: Leader | null | undefined;
  let maxToken = 0n;
  const emit = function* (l: Leader | null): Generator<Leader | null> {
    if (l !== null && l.token < maxToken) return; // an older leader than one reported: skipped, never reordered
    if (last !== undefined && same(last, l)) return;
    if (l !== null) maxToken = l.token;
    last = l;
    yield l;
  };
  const read = async (): Promise<Leader | null> => {
    const r = await c.api.inspect(create(InspectRequestSchema, { key: name }), { signal });
    if (!r.held || !r.lock) return null;
    return { session: r.lock.sessionId, owner: r.lock.owner, labels: r.lock.labels, value: r.lock.value, token: r.lock.token };
  };
  for (let attempt = 0; !signal.aborted; attempt++) {
    try {
      let established = false;
      for await (const m of rawWatch(c, create(WatchRequestSchema, { prefix: name, holder: true, progress: true }), signal)) {
        attempt = 0;
        if (!established || m.kind === EventKind.RESYNC) {
          established = true;
          yield* emit(await read());
          if (m.kind === EventKind.PROGRESS || m.kind === EventKind.RESYNC) continue;
        }
        if (m.key !== name) continue;
        switch (m.kind) {
          case EventKind.ACQUIRED:
            yield* emit({ session: m.sessionId, owner: m.owner, labels: m.labels, value: m.value, token: m.token });
            break;
          case EventKind.VALUE:
            if (last && last.token === m.token) yield* emit({ ...last, value: m.value, owner: m.owner, labels: m.labels });
            break;
          case EventKind.RELEASED:
          case EventKind.EXPIRED:
          case EventKind.REVOKED:
          case EventKind.MAX_HOLD:
            if (last && last.token === m.token) yield* emit(null);
            break;
        }
      }
    } catch (e) {
      if (signal.aborted) return;
      if (!retryable(e)) throw e;
      c.debug("observe: watch broke; re-reading", e);
    }
    if (!(await sleep(c.clock, c.backoff(attempt), signal))) return;
  }
}
