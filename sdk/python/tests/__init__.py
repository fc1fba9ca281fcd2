"""The SDK's tests. PYSDK_DEBUG=1 logs the SDK's debug records to stderr."""

import logging
import os

if os.environ.get("PYSDK_DEBUG"):
    logging.basicConfig(level=logging.DEBUG, format="%(relativeCreated)8.0f %(threadName)s %(message)s")
