"""Decodes the grpc-status-details-bin trailer (google.rpc.Status) far
enough to read lockd's ErrorInfo reason and a BadRequest field violation.

Debian ships no googleapis Python package, so the three messages are read
from the protobuf wire format here (field numbers of google/rpc/status.proto
and error_details.proto): Status{code=1, message=2, details=3 (Any)},
Any{type_url=1, value=2}, ErrorInfo{reason=1, domain=2, metadata=3 (map:
"limit" of LIMIT, "keys" of DEADLOCK)},
BadRequest{field_violations=1 {field=1, description=2}}. Malformed input
yields empty fields, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Details:
    reason: str = ""
    field: str = ""
    description: str = ""
    limit: str = ""
    keys: str = ""  # DEADLOCK: the cycle's keys, a JSON array


def _fields(buf: bytes):
    """Yields (field number, wire type, value) of a message; stops at garbage."""
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        if i < 0:
            return
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
            if i < 0:
                return
            yield num, wt, v
        elif wt == 2:
            ln, i = _varint(buf, i)
            if i < 0 or i + ln > n:
                return
            yield num, wt, buf[i:i + ln]
            i += ln
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        else:
            return


def _varint(buf: bytes, i: int):
    shift, v = 0, 0
    while i < len(buf) and shift < 64:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return v, i
        shift += 7
    return 0, -1


def _str(v) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else ""


def decode(raw: bytes, domain: str) -> Details:
    out = Details()
    for num, wt, v in _fields(raw):
        if num != 3 or wt != 2:
            continue
        type_url, value = "", b""
        for n2, w2, v2 in _fields(v):
            if n2 == 1 and w2 == 2:
                type_url = _str(v2)
            elif n2 == 2 and w2 == 2:
                value = bytes(v2)
        if type_url.endswith("/google.rpc.ErrorInfo"):
            reason, dom, meta = "", "", {}
            for n3, w3, v3 in _fields(value):
                if w3 != 2:
                    continue
                if n3 == 1:
                    reason = _str(v3)
                elif n3 == 2:
                    dom = _str(v3)
                elif n3 == 3:
                    k = val = ""
                    for n4, w4, v4 in _fields(v3):
                        if n4 == 1 and w4 == 2:
                            k = _str(v4)
                        elif n4 == 2 and w4 == 2:
                            val = _str(v4)
                    meta[k] = val
            if dom == domain:
                out.reason = reason
                out.limit = meta.get("limit", "")
                out.keys = meta.get("keys", "")
        elif type_url.endswith("/google.rpc.BadRequest"):
            for n3, w3, v3 in _fields(value):
                if n3 == 1 and w3 == 2 and not out.field:
                    for n4, w4, v4 in _fields(v3):
                        if n4 == 1 and w4 == 2:
                            out.field = _str(v4)
                        elif n4 == 2 and w4 == 2:
                            out.description = _str(v4)
    return out
