"""A stand-in for the opentelemetry-api package's names the SDK uses
(opentelemetry.trace: SpanKind, Status, StatusCode), for tests/test_trace.py
on machines without the package (Debian has none). Put on sys.path only when
the real package cannot be imported; the tracer provider of the tests is
their own either way."""
