"""Tracing (docs/contracts/C4.md #ct4-traces): with tracer_provider, each
unary call attempt of lockd.Client and lockd.aio.Client is a client span
started in the caller's context, and the W3C trace context of that span
reaches the server in the call's metadata; without one, none is sent.

The server is a real gRPC server in this process (lockd's LockService
stubs) that records the metadata of each call, since lockd itself hands
trace context only to its OTLP exporter. The tracer provider is the test's
own, recording spans; the opentelemetry-api names the SDK imports
(SpanKind, Status, StatusCode) come from the real package when it is
installed, else from tests/otelapi (Debian ships no such package)."""

import asyncio
import contextvars
import itertools
import os
import sys
import threading
import time
import unittest
from concurrent import futures

import grpc

try:
    import opentelemetry.trace  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "otelapi"))

import lockd
import lockd.aio
from lockd.v1 import lockd_pb2 as pb
from lockd.v1 import lockd_pb2_grpc

CURRENT = contextvars.ContextVar("current_span", default=None)


class Ctx:
    def __init__(self, trace_id, span_id, flags=1, state="", valid=True):
        self.trace_id, self.span_id, self.trace_flags = trace_id, span_id, flags
        self.trace_state = _State(state) if state else None
        self.is_valid = valid


class _State:
    def __init__(self, h):
        self.h = h

    def to_header(self):
        return self.h

    def __bool__(self):
        return bool(self.h)


class Span:
    def __init__(self, tracer, name, kind, attributes, parent):
        self.tracer, self.name, self.kind, self.parent = tracer, name, kind, parent
        self.attributes = dict(attributes or {})
        self.status = None
        self.ended = False
        trace_id = parent.ctx.trace_id if parent else 0xABC0000000000000000000000000DEF
        self.ctx = Ctx(trace_id, next(tracer.ids), state=tracer.state, valid=tracer.valid)

    def get_span_context(self):
        return self.ctx

    def set_attribute(self, k, v):
        self.attributes[k] = v

    def set_status(self, st):
        self.status = st

    def end(self):
        self.ended = True


class Tracer:
    def __init__(self, state="", valid=True):
        self.spans = []
        self.scopes = []
        self.ids = itertools.count(0x1000)
        self.state, self.valid = state, valid

    def get_tracer(self, name, *a, **kw):
        self.scopes.append(name)
        return self

    def start_span(self, name, context=None, kind=None, attributes=None, **kw):
        s = Span(self, name, kind, attributes, CURRENT.get())
        self.spans.append(s)
        return s


class Recorder(lockd_pb2_grpc.LockServiceServicer):
    def __init__(self):
        self.md = []
        self.methods = []
        self.release_acquire = threading.Event()

    def OpenSession(self, request, context):
        self.methods.append("OpenSession")
        return pb.OpenSessionResponse(session_id="s1", session_secret=b"x" * 32, ttl_ms=60000, remaining_ms=60000,
                                      safety_margin_ms=1000, heartbeat_interval_ms=20000)

    def Acquire(self, request, context):
        self.methods.append("Acquire")
        self.release_acquire.wait(30)  # a wait the caller gives up
        context.abort(grpc.StatusCode.CANCELLED, "gone")

    def LeaveQueue(self, request, context):
        self.methods.append("LeaveQueue")
        return pb.LeaveQueueResponse()

    def CloseSession(self, request, context):
        self.methods.append("CloseSession")
        return pb.CloseSessionResponse()

    def Inspect(self, request, context):
        self.methods.append("Inspect")
        self.md.append(dict(context.invocation_metadata()))
        return pb.InspectResponse(held=False)

    def Revoke(self, request, context):
        self.md.append(dict(context.invocation_metadata()))
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "no")


def traceparent(span):
    return f"00-{span.ctx.trace_id:032x}-{span.ctx.span_id:016x}-01"


class TraceTest(unittest.TestCase):
    def setUp(self):
        self.rec = Recorder()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        lockd_pb2_grpc.add_LockServiceServicer_to_server(self.rec, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.addCleanup(self.server.stop, None)
        self.addCleanup(self.rec.release_acquire.set)
        self.addr = f"127.0.0.1:{port}"

    def check_call(self, tp, md, parent, method="Inspect", code="OK"):
        span = tp.spans[-1]
        name = "lockd.v1.LockService/" + method
        self.assertEqual((span.name, span.kind.name, span.ended), (name, "CLIENT", True))
        self.assertEqual(span.attributes, {"rpc.system.name": "grpc", "rpc.method": name,
                                           "rpc.response.status_code": code})
        self.assertIs(span.parent, parent, "the client span is not the child of the caller's current span")
        self.assertEqual(md.get("traceparent"), traceparent(span))
        if code == "OK":
            self.assertIsNone(span.status)
        else:
            self.assertEqual((span.status.status_code.name, span.status.description), ("ERROR", code))
        self.assertEqual(tp.scopes, ["lockd"])

    def test_sync(self):
        tp = Tracer(state="vendor=x")
        with lockd.Client(self.addr, tracer_provider=tp) as c:
            parent = Span(tp, "app", None, None, None)
            tok = CURRENT.set(parent)
            try:
                c.inspect("k")
                with self.assertRaises(lockd.LockdError):  # PERMISSION_DENIED without a reason
                    c.revoke("k")
            finally:
                CURRENT.reset(tok)
        self.assertEqual(len(tp.spans), 2)
        tp.spans, last = tp.spans[:1], tp.spans[1]
        self.check_call(tp, self.rec.md[0], parent)
        self.assertEqual(self.rec.md[0].get("tracestate"), "vendor=x")
        tp.spans = [last]
        self.check_call(tp, self.rec.md[1], parent, "Revoke", "PERMISSION_DENIED")

    def test_aio(self):
        tp = Tracer()

        async def body():
            async with lockd.aio.Client(self.addr, tracer_provider=tp) as c:
                async def traced(parent):
                    CURRENT.set(parent)  # this task's context only
                    await c.inspect("k")
                    return tp.spans[-1], self.rec.md[-1]
                p1, p2 = Span(tp, "a", None, None, None), Span(tp, "b", None, None, None)
                (s1, md1), = await asyncio.gather(traced(p1))
                (s2, md2), = await asyncio.gather(traced(p2))
                await c.inspect("k")  # outside both: a root span
                return (s1, md1, p1), (s2, md2, p2)
        calls = asyncio.run(asyncio.wait_for(body(), 60))
        for span, md, parent in calls:
            self.assertIs(span.parent, parent)
            self.assertEqual(md.get("traceparent"), traceparent(span))
            self.assertNotIn("tracestate", md)
        self.assertIsNone(tp.spans[-1].parent)
        self.assertEqual(self.rec.md[-1].get("traceparent"), traceparent(tp.spans[-1]))
        self.check_call(tp, self.rec.md[-1], None)

    def test_aio_own_calls(self):
        """lockd.aio: a waiting acquire's Inspect reads are children of the
        caller's span (work for its call); the LeaveQueue the SDK sends on
        its own after the task was cancelled is a trace of its own (C4
        #ct4-traces)."""
        tp = Tracer()

        async def body():
            async with lockd.aio.Client(self.addr, tracer_provider=tp) as c:
                s = await c.session()
                parent = Span(tp, "app", None, None, None)

                async def waiting():
                    CURRENT.set(parent)
                    await s.acquire("k", on_wait_update=lambda u: None, wait_update_every=0.1)
                task = asyncio.ensure_future(waiting())
                end = time.monotonic() + 30
                while "Inspect" not in self.rec.methods and time.monotonic() < end:
                    await asyncio.sleep(0.01)
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                while "LeaveQueue" not in self.rec.methods and time.monotonic() < end:
                    await asyncio.sleep(0.01)
                await s.close()
                return parent
        parent = asyncio.run(asyncio.wait_for(body(), 60))
        by = {}
        for sp in tp.spans:
            by.setdefault(sp.name.rsplit("/", 1)[1], []).append(sp)
        self.assertIn("Inspect", by)
        self.assertIn("LeaveQueue", by)
        self.assertEqual([sp.parent for sp in by["Acquire"]], [parent], "the caller's own call")
        self.assertEqual({sp.parent for sp in by["Inspect"]}, {parent}, "the acquire's reads")
        self.assertEqual({sp.parent for sp in by["LeaveQueue"]}, {None}, "LeaveQueue: a child of the caller's span")

    def test_sync_own_calls(self):
        """The sync SDK: a waiting acquire's Inspect reads (its thread runs in
        the caller's context) are children of the caller's span; the
        LeaveQueue after a cancelled wait (a thread of the client's) is not."""
        tp = Tracer()
        parent = Span(tp, "app", None, None, None)
        with lockd.Client(self.addr, tracer_provider=tp) as c:
            s = c.session()
            cancel = lockd.Cancel()
            errs = []

            def waiting():
                CURRENT.set(parent)
                try:
                    s.acquire("k", cancel=cancel, on_wait_update=lambda u: None, wait_update_every=0.1)
                except lockd.LockdError as e:
                    errs.append(e)
            t = threading.Thread(target=waiting)
            t.start()
            end = time.monotonic() + 30
            while "Inspect" not in self.rec.methods and time.monotonic() < end:
                time.sleep(0.01)
            cancel.cancel()
            t.join(30)
            while "LeaveQueue" not in self.rec.methods and time.monotonic() < end:
                time.sleep(0.01)
            s.close()
        self.assertIsInstance(errs[0], lockd.Cancelled)
        by = {}
        for sp in tp.spans:
            by.setdefault(sp.name.rsplit("/", 1)[1], []).append(sp)
        self.assertEqual([sp.parent for sp in by["Acquire"]], [parent])
        self.assertEqual({sp.parent for sp in by["Inspect"]}, {parent}, "the acquire's reads")
        self.assertEqual({sp.parent for sp in by["LeaveQueue"]}, {None})

    def test_off(self):
        # No provider: no trace context. A provider whose spans are not
        # valid (a no-op one): spans ended, no trace context.
        with lockd.Client(self.addr) as c:
            c.inspect("k")
        noop = Tracer(valid=False)
        with lockd.Client(self.addr, tracer_provider=noop) as c:
            c.inspect("k")
        for md in self.rec.md:
            self.assertNotIn("traceparent", md)
            self.assertNotIn("tracestate", md)
        self.assertEqual([s.ended for s in noop.spans], [True])

    def test_refused(self):
        with self.assertRaises(lockd.InvalidArgument) as cm:
            lockd.Client(self.addr, tracer_provider=object())
        self.assertEqual(cm.exception.field, "tracer_provider")
        saved = {k: v for k, v in sys.modules.items() if k == "opentelemetry" or k.startswith("opentelemetry.")}
        try:
            for k in saved:
                sys.modules[k] = None  # the package cannot be imported
            sys.modules["opentelemetry"] = None
            with self.assertRaises(lockd.InvalidArgument) as cm:
                lockd.aio.Client(self.addr, tracer_provider=Tracer())
            self.assertIn("opentelemetry-api", str(cm.exception))
        finally:
            for k in list(sys.modules):
                if k == "opentelemetry" or k.startswith("opentelemetry."):
                    del sys.modules[k]
            sys.modules.update(saved)


if __name__ == "__main__":
    unittest.main()
