"""The README's Python quickstart runs against a real lockd (the same block
in README.md and sdk/python/README.md)."""

import os
import re
import subprocess
import sys
import unittest

from . import integration as it

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))


def quickstart(path, heading):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


class ReadmeTest(unittest.TestCase):
    def test_blocks_agree(self):
        top = quickstart(os.path.join(ROOT, "README.md"), "## Using lockd from Python")
        sdk = quickstart(os.path.join(ROOT, "sdk", "python", "README.md"), "## Quickstart")
        self.assertEqual(top, sdk, "README.md and sdk/python/README.md quickstarts differ")
        self.assertLessEqual(len(top.strip().splitlines()), 10)

    @it.need("PYSDK_BACKENDS")
    def test_quickstart_runs(self):
        code = quickstart(os.path.join(ROOT, "README.md"), "## Using lockd from Python")
        for b in it.BACKENDS:
            with self.subTest(backend=b):
                src = code.replace('"127.0.0.1:7420"', repr(it.addr(b)))
                self.assertNotEqual(src, code, "the quickstart no longer names 127.0.0.1:7420")
                env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "sdk", "python"))
                out = subprocess.run([sys.executable, "-c", src], env=env, capture_output=True, text=True,
                                     timeout=120)
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertRegex(out.stdout, r"^holding jobs/nightly with token \d+\nreleased\n$")

    @it.need("PYSDK_BACKENDS")
    def test_asyncio_block_runs(self):
        text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
        section = text[text.index("## Using lockd from Python"):]
        code = re.findall(r"```python\n(.*?)```", section, re.S)[1]
        self.assertIn("lockd.aio", code)
        for b in it.BACKENDS:
            with self.subTest(backend=b):
                src = code.replace('"127.0.0.1:7420"', repr(it.addr(b)))
                self.assertNotEqual(src, code, "the asyncio block no longer names 127.0.0.1:7420")
                env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "sdk", "python"))
                out = subprocess.run([sys.executable, "-c", src], env=env, capture_output=True, text=True,
                                     timeout=120)
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertRegex(out.stdout, r"^holding jobs/nightly with token \d+\n$")


if __name__ == "__main__":
    unittest.main()
