"""The asyncio API of lockd, on grpc.aio (docs/contracts/C2.md #ct2-sdk).

The same objects as the sync API with awaitable calls, run on one event
loop: no thread of its own. The timing rules are the sync SDK's very
functions (deadline from the send time minus the margin, the heartbeat
schedule of #ct2-deadline, held sets, notices acknowledged on the stream
they came on, unclaimed grants released), applied on the loop; the waits
are asyncio's. A client's sessions share one KeepAlive stream kept by a task
that runs while the client has a session; the last session's close cancels
it and waits for it, and the client's close waits for every task the client
started. A lock's ``lost`` is an asyncio.Event. Cancelling a task that
awaits ``acquire`` cancels the wait on the server (its queue place is left;
a grant that raced the cancellation is released when the next heartbeat
answer lists it).

Heartbeats are sent by the event loop: an application that blocks its loop
for longer than the time between a heartbeat and the deadline (less than
the TTL minus the safety margin) loses its locks, as it should — their
``valid()`` turns false on the monotonic clock whatever the loop does, but
the ``lost`` Event is set only when the loop runs again. Use the sync API
(its own threads) when the loop may block.

    async with lockd.aio.Client("127.0.0.1:7420") as c:
        async with await c.session(ttl=15) as s:
            async with await s.acquire("jobs/nightly", timeout=30) as lock:
                await work(lock.token)
"""

from __future__ import annotations

from ._aioclient import Client
from ._aiosession import Leadership, Lock, Session
from ._aiowatch import Observer, Watch

__all__ = ["Client", "Session", "Lock", "Leadership", "Watch", "Observer"]
