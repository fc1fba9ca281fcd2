"""CPU per acquire+release pair of lockd.aio against the sync API (not a
test: a measurement, docs/backends.md "SDK rows"). c clients, each with its
own session, acquiring and releasing 16 keys of its own one pair after
another for the given seconds: threads for the sync API, tasks on one event
loop for lockd.aio. Prints pairs/s and the process's CPU µs per pair (every
thread, grpc's included). Run from sdk/python with a lockd at LOCKD_ADDR:

    LOCKD_ADDR=127.0.0.1:7420 /usr/bin/python3 tests/aio_cpu.py {sync|aio} C SECONDS
"""
import asyncio, json, os, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import lockd, lockd.aio
ADDR = os.environ.get("LOCKD_ADDR", "127.0.0.1:7420")
DUR = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0

def run_sync(c, tag):
    with lockd.Client(ADDR) as cl:
        ss = [cl.session() for _ in range(c)]
        n = [0] * c
        end = time.monotonic() + DUR
        def w(i):
            k = 0
            while time.monotonic() < end:
                ss[i].acquire(f"{tag}/c{i}/k{k % 16}").release(); k += 1
            n[i] = k
        t0, p0 = time.monotonic(), time.process_time()
        ts = [threading.Thread(target=w, args=(i,)) for i in range(c)]
        [t.start() for t in ts]; [t.join() for t in ts]
        return sum(n), time.monotonic() - t0, time.process_time() - p0

async def run_aio(c, tag):
    async with lockd.aio.Client(ADDR) as cl:
        ss = [await cl.session() for _ in range(c)]
        n = [0] * c
        end = time.monotonic() + DUR
        async def w(i):
            k = 0
            while time.monotonic() < end:
                l = await ss[i].acquire(f"{tag}/c{i}/k{k % 16}"); await l.release(); k += 1
            n[i] = k
        t0, p0 = time.monotonic(), time.process_time()
        await asyncio.gather(*(w(i) for i in range(c)))
        return sum(n), time.monotonic() - t0, time.process_time() - p0

mode, c = sys.argv[1], int(sys.argv[2])
tag = f"b{mode}{c}{time.time_ns()}"
pairs, el, cpu = run_sync(c, tag) if mode == "sync" else asyncio.run(run_aio(c, tag))
print(json.dumps({"mode": mode, "c": c, "pairs": pairs, "pairs_s": round(pairs / el), "cpu_us_pair": round(cpu / pairs * 1e6)}))
