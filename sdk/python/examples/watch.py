"""Watch a prefix and react to a lock's loss. Run: python3 watch.py HOST:PORT"""

import sys
import threading

import lockd

addr = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7420"
with lockd.Client(addr) as client, client.session() as session:
    with client.watch("examples/jobs/") as events:
        lock = session.acquire("examples/jobs/a")
        told = threading.Event()
        lock.on_lost(lambda err: (print("lost:", type(err).__name__), told.set()))  # runs on an SDK thread
        client.revoke("examples/jobs/a")  # an administrator takes it away
        lock.lost.wait(10)  # set the moment trust ends (before the callbacks run)
        told.wait(10)
        for ev in events:
            print("event:", ev.kind, ev.key)
            if ev.kind == lockd.EventKind.REVOKED:
                break
