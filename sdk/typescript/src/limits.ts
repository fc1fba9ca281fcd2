// Request bounds of C2 #ct2-keys, #ct2-holder, #ct2-delay and #ct2-multi: the
// same checks as proto/lockd/v1/wirelimits (the Go SDK's), so invalid input
// is refused before anything is sent.
import { InvalidArgumentError } from "./errors.js";

export const MAX_KEY_BYTES = 512;
export const MIN_TTL_MS = 2_000;
export const MAX_TTL_MS = 3_600_000;
export const MAX_OWNER_BYTES = 128;
export const MAX_LABELS = 8;
export const MAX_LABEL_BYTES = 64;
export const MAX_VALUE_BYTES = 4096;
export const MAX_LOCK_DELAY_MS = 3_600_000;
export const MIN_MAX_HOLD_MS = 1_000;
export const MAX_MAX_HOLD_MS = 168 * 3_600_000;
export const MAX_LIMIT = 1024;
export const MAX_LIST_LIMIT = 1000;
/** The shortest heartbeat interval a client may ask for (C5 lock.client.heartbeat-interval). */
export const MIN_HEARTBEAT_INTERVAL_MS = 100;

const utf8 = new TextEncoder();

function byteLen(s: string): number {
  return utf8.encode(s).length;
}

/** A string that is valid UTF-16 text without lone surrogates (so valid UTF-8 on the wire). */
function wellFormed(s: string): boolean {
  return !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s);
}

function printable(s: string): boolean {
  // No control characters (C0, DEL, C1), as wirelimits' printable check.
  return wellFormed(s) && !/[\u0000-\u001f\u007f-\u009f]/.test(s);
}

export function checkKey(key: string, field = "key"): void {
  if (typeof key !== "string" || key === "") throw new InvalidArgumentError(`${field}: key is empty`, field);
  const n = byteLen(key);
  if (n > MAX_KEY_BYTES) throw new InvalidArgumentError(`${field}: key is ${n} bytes, at most ${MAX_KEY_BYTES} allowed`, field);
  if (!wellFormed(key)) throw new InvalidArgumentError(`${field}: key is not valid UTF-8`, field);
  if (key.includes("\u0000")) throw new InvalidArgumentError(`${field}: key contains a NUL byte`, field);
}

export function checkPrefix(prefix: string): void {
  if (prefix !== "") checkKey(prefix, "prefix");
}

export function checkWholeMs(field: string, v: number): void {
  if (!Number.isInteger(v) || v < 0) throw new InvalidArgumentError(`${field}: ${v} is negative or not whole milliseconds`, field);
}

export function checkOwner(owner: string): void {
  const n = byteLen(owner);
  if (n > MAX_OWNER_BYTES) throw new InvalidArgumentError(`owner: owner is ${n} bytes, at most ${MAX_OWNER_BYTES} allowed`, "owner");
  if (!printable(owner)) throw new InvalidArgumentError("owner: owner is not printable UTF-8", "owner");
}

export function checkLabels(labels: Record<string, string>): void {
  const entries = Object.entries(labels);
  if (entries.length > MAX_LABELS) {
    throw new InvalidArgumentError(`labels: labels has ${entries.length} entries, at most ${MAX_LABELS} allowed`, "labels");
  }
  for (const [k, v] of entries) {
    if (k === "") throw new InvalidArgumentError("labels: labels has an empty key", "labels");
    if (byteLen(k) > MAX_LABEL_BYTES || byteLen(v) > MAX_LABEL_BYTES || !printable(k) || !printable(v)) {
      throw new InvalidArgumentError(`labels: labels entry ${JSON.stringify(k)} is too long or not printable UTF-8`, "labels");
    }
  }
}

export function checkValue(value: Uint8Array): void {
  if (value.length > MAX_VALUE_BYTES) {
    throw new InvalidArgumentError(`value: value is ${value.length} bytes, at most ${MAX_VALUE_BYTES} allowed`, "value");
  }
}

export function checkLockDelay(ms: number): void {
  checkWholeMs("lock_delay", ms);
  if (ms > MAX_LOCK_DELAY_MS) throw new InvalidArgumentError(`lock_delay: ${ms} ms is above ${MAX_LOCK_DELAY_MS} ms`, "lock_delay");
}

export function checkMaxHold(ms: number): void {
  checkWholeMs("max_hold", ms);
  if (ms !== 0 && (ms < MIN_MAX_HOLD_MS || ms > MAX_MAX_HOLD_MS)) {
    throw new InvalidArgumentError(`max_hold: ${ms} ms is outside ${MIN_MAX_HOLD_MS}..${MAX_MAX_HOLD_MS} ms`, "max_hold");
  }
}

/**
 * Checks a safety margin and heartbeat interval against a session TTL with the
 * server's rules (C5 lock.client.*, the Go SDK's checkTiming): 0 < margin <
 * ttl/2, and MIN_HEARTBEAT_INTERVAL_MS <= interval <= ttl − 2×margin. A zero
 * value is not known yet and not checked, except that an interval must be
 * below a known ttl whatever the margin. A margin or interval the TTL cannot
 * carry is refused (C2 #ct2-deadline).
 */
export function checkTiming(ttl: number, margin: number, interval: number): void {
  if (margin < 0 || interval < 0 || ttl < 0) {
    throw new InvalidArgumentError(`negative safety margin (${margin} ms), heartbeat interval (${interval} ms) or ttl (${ttl} ms)`);
  }
  if (ttl > 0 && margin > 0 && margin >= ttl / 2) {
    throw new InvalidArgumentError(`safety margin ${margin} ms must be > 0 and < ttl/2 (ttl ${ttl} ms)`);
  }
  if (interval > 0 && interval < MIN_HEARTBEAT_INTERVAL_MS) {
    throw new InvalidArgumentError(`heartbeat interval ${interval} ms is below the minimum ${MIN_HEARTBEAT_INTERVAL_MS} ms`);
  }
  if (ttl > 0 && margin > 0 && interval > ttl - 2 * margin) {
    throw new InvalidArgumentError(
      `heartbeat interval ${interval} ms must be at most ttl − 2×safety margin = ${ttl - 2 * margin} ms (ttl ${ttl} ms, margin ${margin} ms)`,
    );
  }
  if (ttl > 0 && interval >= ttl) {
    throw new InvalidArgumentError(`heartbeat interval ${interval} ms must be below the ttl ${ttl} ms`);
  }
}
