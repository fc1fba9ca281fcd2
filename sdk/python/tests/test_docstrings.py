"""Every public method of the public classes of ``lockd`` and ``lockd.aio``
has a docstring (issue 25: API docs as docstrings); an override without one
shows its base class's, as ``help()`` does."""

import inspect
import unittest

import lockd
import lockd.aio


def undocumented():
    missing = []
    for mod in (lockd, lockd.aio):
        for name in mod.__all__:
            cls = getattr(mod, name)
            if not inspect.isclass(cls) or issubclass(cls, BaseException):
                continue
            if not inspect.getdoc(cls):
                missing.append(f"{mod.__name__}.{name}")
            for attr, v in inspect.getmembers(cls):
                if attr.startswith("_") or inspect.isclass(v) or not callable(v):
                    continue
                if not inspect.getdoc(v):
                    missing.append(f"{mod.__name__}.{name}.{attr}")
    return missing


class DocstringTest(unittest.TestCase):
    def test_public_methods_documented(self):
        self.maxDiff = None
        self.assertEqual(undocumented(), [], "public methods without a docstring")


if __name__ == "__main__":
    unittest.main()
