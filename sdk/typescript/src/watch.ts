// Watch with resume (C2 #ct2-watch, #ct2-watch-resume, #ct2-watch-progress;
// the Go SDK's watch.go and silence.go).
import { create } from "@bufbuild/protobuf";
import { sleep } from "./clock.js";
import { retryable, UnavailableError } from "./errors.js";
import { EventKind, WatchRequestSchema, type WatchRequest, type WatchResponse } from "./gen/lockd/v1/lockd_pb.js";
import { checkPrefix } from "./limits.js";
import type { Client } from "./client.js";

/** What happened to a key. "resync": the watch could not resume from its cursor; re-read the state you follow. */
export type EventKindName = "acquired" | "released" | "expired" | "revoked" | "value" | "max_hold" | "resync";

/** One watch event. Owner, labels and value are filled only with `holders: true` (C2 #ct2-holder). */
export interface WatchEvent {
  kind: EventKindName;
  key: string;
  session: string;
  token: bigint;
  owner: string;
  labels: Record<string, string>;
  value: Uint8Array;
  /** The position just after this event: pass it as `resumeAfter` to resume from here. */
  cursor: string;
}

/** Options of {@link Client.watch}. */
export interface WatchOptions {
  signal?: AbortSignal;
  /** Fill owner, labels and value, and deliver "value" events. */
  holders?: boolean;
  /** Start right after this cursor instead of now. */
  resumeAfter?: string;
}

const KINDS: Partial<Record<EventKind, EventKindName>> = {
  [EventKind.ACQUIRED]: "acquired",
  [EventKind.RELEASED]: "released",
  [EventKind.EXPIRED]: "expired",
  [EventKind.REVOKED]: "revoked",
  [EventKind.VALUE]: "value",
  [EventKind.MAX_HOLD]: "max_hold",
  [EventKind.RESYNC]: "resync",
};

/**
 * @internal One Watch stream as an async iterable of its messages; it throws
 * the error the stream ended with. With several addresses, a stream that has
 * given nothing for its silence bound (3 progress intervals, at least 1 s)
 * is treated as broken and its replica set aside.
 */
export async function* rawWatch(c: Client, req: WatchRequest, signal: AbortSignal): AsyncGenerator<WatchResponse> {
  const queue: WatchResponse[] = [];
  let ended: { err: unknown } | undefined;
  let wake: (() => void) | undefined;
  const poke = () => {
    wake?.();
    wake = undefined;
  };
  const st = c.api.watch(req);
  const finish = (err: unknown) => {
    if (!ended) ended = { err };
    poke();
  };
  st.start((m) => {
    queue.push(m);
    poke();
  }, finish);
  const onAbort = () => {
    st.cancel();
    finish(signal.reason);
  };
  signal.addEventListener("abort", onAbort, { once: true });
  let bound = 0; // the silence bound, once the stream sent a progress
  let silence: { cancel(): void } | undefined;
  const armSilence = () => {
    silence?.cancel();
    if (bound === 0 || !c.api.several) return;
    silence = c.clock.setTimer(bound, () => {
      if (c.api.setAside(st.peer, false)) {
        st.cancel();
        finish(new UnavailableError("watch stream silent"));
      }
    });
  };
  try {
    for (;;) {
      const m = queue.shift();
      if (m) {
        if (m.kind === EventKind.PROGRESS && m.progressIntervalMs > 0n) bound = Math.max(3 * Number(m.progressIntervalMs), 1000);
        armSilence();
        yield m;
        continue;
      }
      if (ended) throw ended.err;
      await new Promise<void>((r) => (wake = r));
    }
  } finally {
    silence?.cancel();
    signal.removeEventListener("abort", onAbort);
    st.cancel();
  }
}

function toEvent(m: WatchResponse, kind: EventKindName): WatchEvent {
  return { kind, key: m.key, session: m.sessionId, token: m.token, owner: m.owner, labels: m.labels, value: m.value, cursor: m.cursor };
}

/**
 * Client.watch: resolves once the watch is established (every change
 * committed after that is delivered), then yields events in commit order,
 * resumed from the last cursor through any replica when the stream breaks.
 */
export async function watch(c: Client, prefix: string, o: WatchOptions): Promise<AsyncIterable<WatchEvent>> {
  checkPrefix(prefix);
  const signal = o.signal ? AbortSignal.any([o.signal, c.signal]) : c.signal;
  let cursor = o.resumeAfter ?? "";
  // Opens a stream and waits for its first message (the server sends a
  // progress as soon as the watch is established), retrying retryable errors.
  const establish = async (): Promise<{ it: AsyncGenerator<WatchResponse>; first: WatchResponse } | undefined> => {
    for (let attempt = 0; ; attempt++) {
      if (signal.aborted) return undefined;
      const it = rawWatch(c, create(WatchRequestSchema, { prefix, holder: !!o.holders, resumeAfter: cursor, progress: true }), signal);
      try {
        const r = await it.next();
        if (!r.done) return { it, first: r.value };
      } catch (e) {
        if (signal.aborted) return undefined;
        if (!retryable(e)) throw e;
        c.debug("watch: opening failed; retrying", e);
      }
      if (!(await sleep(c.clock, c.backoff(attempt), signal))) return undefined;
    }
  };
  let cur = await establish();
  if (!cur && o.signal?.aborted) throw o.signal.reason;
  return (async function* () {
    while (cur) {
      const { it, first } = cur;
      try {
        for (let m: WatchResponse | undefined = first; m; m = (await it.next()).value as WatchResponse | undefined) {
          if (m.cursor !== "") cursor = m.cursor;
          const kind = KINDS[m.kind];
          if (kind) yield toEvent(m, kind); // a progress only moves the cursor
        }
      } catch (e) {
        if (signal.aborted) return;
        if (!retryable(e)) throw e;
        c.debug("watch broke; resuming", e);
      } finally {
        await it.return(undefined);
      }
      if (cursor === "") {
        // Nothing to resume from: what happened meanwhile is unknown.
        yield { kind: "resync", key: "", session: "", token: 0n, owner: "", labels: {}, value: new Uint8Array(), cursor: "" };
      }
      if (!(await sleep(c.clock, c.backoff(0), signal))) return;
      cur = await establish();
    }
  })();
}
