"""A semaphore of 2: two sessions hold a slot at once, a third is refused.
Run: python3 semaphore.py HOST:PORT"""

import sys

import lockd

addr = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7420"
with lockd.Client(addr) as client:
    sessions = [client.session() for _ in range(3)]
    first = sessions[0].acquire("examples/pool", limit=2)
    second = sessions[1].acquire("examples/pool", limit=2)
    try:
        sessions[2].try_acquire("examples/pool", limit=2)
    except lockd.Locked:
        print("third: locked")
    print("holders:", len(client.inspect("examples/pool").holders))
    first.release()
    with sessions[2].acquire("examples/pool", limit=2, timeout=10) as third:
        print("third: granted, token higher:", third.token > second.token)
    second.release()
