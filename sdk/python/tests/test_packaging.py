"""`pip install ./sdk/python` works offline (no index, Debian's setuptools),
and the installed package imports from outside the source tree."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, ".."))


class PackagingTest(unittest.TestCase):
    def test_pip_install(self):
        with tempfile.TemporaryDirectory() as tmp:
            # A copy: setuptools builds in the source tree.
            src = os.path.join(tmp, "src")
            shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "tests"))
            target = os.path.join(tmp, "site")
            out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                                  "--no-index", "--target", target, src], capture_output=True, text=True, timeout=300)
            self.assertEqual(out.returncode, 0, out.stderr)
            env = dict(os.environ, PYTHONPATH=target)
            out = subprocess.run([sys.executable, "-c", "import lockd, lockd.v1.lockd_pb2_grpc; print(lockd.__file__)"],
                                 cwd=tmp, env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertTrue(out.stdout.startswith(target), out.stdout)


if __name__ == "__main__":
    unittest.main()
