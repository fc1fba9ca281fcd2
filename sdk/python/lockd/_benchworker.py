"""A `lockd bench` worker on the Python SDK: one cell of the distinct
scenario measured through this SDK in a process of its own, so that the
bench reports the SDK's figures as a ratio to the Go SDK's in the same run
(issue 25; internal/bench sdk.go). Run as ``python3 -m lockd._benchworker``
with the SDK on PYTHONPATH; not for use by hand.

stdin: the bench's job, one JSON object (internal/bench workerJob): system
"lockd", scenario "distinct", c clients, the window's duration in
nanoseconds, a tag that makes the keys unique, lockd's address. stdout: one
JSON object (workerResult): ops (pairs in the window), elapsed and every
pair's latency in nanoseconds, pairs per client, the process's CPU time in
the window (cpu_ns.client, every thread); or error. The load is the Go
bench's distinctLoad: one client, a session per simulated client, each
acquiring and releasing keys of its own (tag/cN/kI, 16 per client) one pair
after another for a warm-up of a fifth of the window (at most a second, on
keys of their own), then for the window, which ends when the last client
finished its last pair. Each simulated client is a thread (the sync API).
"""

from __future__ import annotations

import json
import sys
import threading
import time

from .client import Client

KEYS_PER_CLIENT = 16  # internal/bench keysPerClient


def _load(sessions: list, dur: float, tag: str) -> dict:
    """distinctLoad: every session's pairs for dur; the first error ends all."""
    deadline = time.monotonic() + dur
    lats: list[list[int]] = [[] for _ in sessions]
    failed: list[BaseException] = []
    stop = threading.Event()

    def client(ci: int) -> None:
        prefix = f"{tag}/c{ci}/k"
        i = 0
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                t0 = time.monotonic_ns()
                sessions[ci].acquire(prefix + str(i % KEYS_PER_CLIENT)).release()
                lats[ci].append(time.monotonic_ns() - t0)
                i += 1
        except BaseException as e:  # reported as the cell's error
            failed.append(RuntimeError(f"client {ci}, pair {i}: {e}"))
            stop.set()

    start, cpu0 = time.monotonic_ns(), time.process_time_ns()
    threads = [threading.Thread(target=client, args=(ci,), daemon=True) for ci in range(len(sessions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed, cpu = time.monotonic_ns() - start, time.process_time_ns() - cpu0
    if failed:
        raise failed[0]
    return {"ops": sum(len(x) for x in lats), "elapsed": elapsed, "lat": [v for x in lats for v in x],
            "per_client": [len(x) for x in lats], "cpu_ns": {"client": cpu}}


def run(job: dict) -> dict:
    if job.get("system") != "lockd" or job.get("scenario") != "distinct":
        raise ValueError(f"the Python SDK's worker measures lockd's distinct scenario, not {job.get('system')!r} "
                         f"{job.get('scenario')!r}")
    c, dur, tag = int(job["c"]), job["duration"] / 1e9, job["tag"]
    if c < 1 or dur <= 0:
        raise ValueError(f"c={c}, duration {dur}s: want both positive")
    cl = Client(job["lockd_addr"])
    sessions: list = []
    try:
        for _ in range(c):
            sessions.append(cl.session())
        warm = min(dur / 5, 1.0)
        if warm > 0:
            _load(sessions, warm, tag + "-warm")
        return _load(sessions, dur, tag)
    finally:
        for s in sessions:
            try:
                s.close(timeout=5.0)
            except Exception:  # best effort: the bench's next cell uses other keys
                pass
        cl.close()


def main() -> int:
    try:
        res = run(json.load(sys.stdin))
        code = 0
    except Exception as e:  # the bench shows the error
        res, code = {"error": f"python sdk: {e}"}, 1
    sys.stdout.write(json.dumps(res) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
