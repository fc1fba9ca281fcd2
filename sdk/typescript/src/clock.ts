/**
 * The SDK's source of time. Every deadline, heartbeat and backoff is measured
 * on it, in milliseconds. The real clock is `performance.now()`: monotonic,
 * immune to wall-clock steps (C2 #ct2-deadline: wall clocks of different
 * machines are never compared). Tests inject a fake clock to check the
 * deadline arithmetic exactly.
 */
export interface Clock {
  /** The current time in milliseconds; only differences between readings are used. */
  now(): number;
  /** Calls `f` once `ms` milliseconds have passed on this clock (soon when `ms <= 0`). */
  setTimer(ms: number, f: () => void): Timer;
}

/** A pending {@link Clock.setTimer} call. */
export interface Timer {
  /** Prevents the call if it has not happened yet. */
  cancel(): void;
}

/** The clock the SDK uses by default: `performance.now()` and `setTimeout`. */
export const realClock: Clock = {
  now: () => performance.now(),
  setTimer(ms, f) {
    const t = setTimeout(f, Math.max(0, ms));
    return { cancel: () => clearTimeout(t) };
  },
};

/** Resolves after `ms` on `clock`; false (at once) when `signal` aborts first. */
export function sleep(clock: Clock, ms: number, signal?: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve(false);
      return;
    }
    const onAbort = () => {
      t.cancel();
      resolve(false);
    };
    const t = clock.setTimer(ms, () => {
      signal?.removeEventListener("abort", onAbort);
      resolve(true);
    });
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
