"""The examples in sdk/python/examples run against a real lockd and print
what their comments say (test/sdk TestPythonSDK)."""

import os
import subprocess
import sys
import unittest

from . import integration as it

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.normpath(os.path.join(HERE, "..", "examples"))

WANT = {
    "election.py": "leader at first: False\nleader: web-1 web-1:8080\nnext leader's token is higher: True\n",
    "semaphore.py": "third: locked\nholders: 2\nthird: granted, token higher: True\n",
    "watch.py": "lost: LockLost\nevent: acquired examples/jobs/a\nevent: revoked examples/jobs/a\n",
}


@it.need("PYSDK_BACKENDS")
class ExamplesTest(unittest.TestCase):
    def test_examples(self):
        self.assertEqual(sorted(WANT), sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py")))
        env = dict(os.environ, PYTHONPATH=os.path.normpath(os.path.join(HERE, "..")))
        for b in it.BACKENDS:
            for name, want in WANT.items():
                with self.subTest(backend=b, example=name):
                    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), it.addr(b)], env=env,
                                         capture_output=True, text=True, timeout=120)
                    self.assertEqual(out.returncode, 0, out.stderr)
                    self.assertEqual(out.stdout, want)


if __name__ == "__main__":
    unittest.main()
