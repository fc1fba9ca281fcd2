// Hot keys: which keys one lockd process saw waited for and held most over
// its recent window (C2 #ct2-hotkeys, issue 27); the Go SDK's hotkeys.go.
import { create } from "@bufbuild/protobuf";
import { HotKeysRequestSchema, type HotKey as PbHotKey } from "./gen/lockd/v1/lockd_pb.js";
import type { Client } from "./client.js";
import { InvalidArgumentError } from "./errors.js";
import { checkPrefix } from "./limits.js";

/** The most entries a ranking may ask for (C2 #ct2-hotkeys). */
export const MAX_HOT_KEYS = 50;

/**
 * One key of a ranking. `score` may over-estimate the key's true total by at
 * most `overcount` (a Space-Saving sketch, C4 #ct4-hotkeys) and never
 * under-estimates it.
 */
export interface HotKey {
  key: string;
  score: bigint;
  overcount: bigint;
}

/**
 * One lockd process's answer, hottest first, ties by key: `byWait` in
 * milliseconds Acquires waited before their grant, `byHold` in milliseconds
 * of ended grants' holds, `byContention` in Acquires admitted to wait.
 * `windowMs` is the longest span a score covers; `enabled` is false when the
 * server keeps no statistics (lock.server.stats.enabled), the rankings then
 * empty.
 */
export interface HotKeys {
  byWait: HotKey[];
  byHold: HotKey[];
  byContention: HotKey[];
  windowMs: number;
  enabled: boolean;
}

/** @internal Client.hotKeys. */
export async function hotKeys(c: Client, prefix: string, opts: { limit?: number; signal?: AbortSignal }): Promise<HotKeys> {
  checkPrefix(prefix);
  const limit = opts.limit ?? 0;
  if (!Number.isInteger(limit) || limit < 0 || limit > MAX_HOT_KEYS) {
    throw new InvalidArgumentError(`limit ${limit}: want 0..${MAX_HOT_KEYS} (0: 10)`, "limit");
  }
  const r = await c.retry(opts.signal, (signal) => c.api.hotKeys(create(HotKeysRequestSchema, { prefix, limit }), { signal }));
  const conv = (hs: PbHotKey[]): HotKey[] => hs.map((h) => ({ key: h.key, score: h.score, overcount: h.overcount }));
  return { byWait: conv(r.byWait), byHold: conv(r.byHold), byContention: conv(r.byContention), windowMs: Number(r.windowMs), enabled: r.enabled };
}
