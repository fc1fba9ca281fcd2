"""Leader election: two candidates, one leads, the other takes over when it
resigns; an observer follows the leader. Run: python3 election.py HOST:PORT"""

import sys
import threading

import lockd

addr = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7420"
with lockd.Client(addr) as client, client.session(owner="web-1") as a, client.session(owner="web-2") as b:
    observer = client.observe("examples/leader")
    print("leader at first:", next(observer).leader)
    lead = a.campaign("examples/leader", b"web-1:8080")
    second = []
    t = threading.Thread(target=lambda: second.append(b.campaign("examples/leader", b"web-2:8080")))
    t.start()
    for o in observer:
        if o.leader and o.value:
            print("leader:", o.owner, o.value.decode())
            break
    lead.resign()  # web-2 leads at once, with a higher token
    t.join()
    print("next leader's token is higher:", second[0].token > lead.token)
    second[0].resign()
    observer.close()
