"""Settings of the integration tests: the servers TestPythonSDK (test/sdk)
started, passed as PYSDK_* environment variables. Without them (a plain
`python3 -m unittest` run) the integration tests are skipped; in
`make test` the Go harness sets them and fails on any skip."""

import os
import unittest
import urllib.request

BACKENDS = [b for b in os.environ.get("PYSDK_BACKENDS", "").split(",") if b]

# lockdtest's server settings (internal/testing/lockdtest: TTL 3 s, margin 0.5 s,
# heartbeat interval TTL/3).
TTL = 3.0
MARGIN = 0.5
# "by the next heartbeat answer": one interval, a reconnect and slack for a
# loaded machine (as client/notice_test.go's heartbeatWait).
HEARTBEAT_WAIT = TTL / 3 + 2.0


def need(*names):
    missing = [n for n in names if not os.environ.get(n)]
    return unittest.skipIf(missing, f"not run by test/sdk TestPythonSDK (missing {', '.join(missing)})")


def addr(backend):
    return os.environ["PYSDK_ADDR_" + backend]


def replicas(backend):
    return os.environ["PYSDK_REPLICAS_" + backend]


def aio_replicas(backend):
    """Two replicas of backend for lockd.aio's failover test (controlled as backend "aio-" + backend)."""
    return os.environ["PYSDK_AIO_REPLICAS_" + backend]


def control(backend, i, action):
    """Stops (drains) or kills replica i of backend through the Go harness."""
    url = f"{os.environ['PYSDK_CONTROL']}/replica/{backend}/{i}/{action}"
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=60) as r:
        return r.read()
