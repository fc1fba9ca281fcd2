"""Helpers of the SDK's tests."""

import time


def poll(cond, timeout=10.0):
    """Waits (real time) until cond() holds; False if it never did. The SDK's
    threads run in real time even under a fake clock: this waits for them to
    apply what the test caused, it does not order events."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()
