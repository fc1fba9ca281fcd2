"""opentelemetry.trace's SpanKind, Status and StatusCode, as the API defines them."""

import enum


class SpanKind(enum.Enum):
    INTERNAL = 0
    SERVER = 1
    CLIENT = 2
    PRODUCER = 3
    CONSUMER = 4


class StatusCode(enum.Enum):
    UNSET = 0
    OK = 1
    ERROR = 2


class Status:
    def __init__(self, status_code=StatusCode.UNSET, description=None):
        self.status_code = status_code
        self.description = description
