"""Names a package hands on that load on first use (PEP 562), so importing it stays cheap."""

import importlib
import sys


def lazy_names(package, exports):
    """`__getattr__` and `__dir__` for `package` (its `__name__`), whose names in
    `exports` (name -> the module that defines it) are imported when first used."""

    def __getattr__(name):
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
