"""Import shims for the peer drivers.

The peers' cache modules are imported unchanged from the packages installed in
``bench/peers/.venv``. A few of their *module-level* imports pull in code that has
nothing to do with the prefix cache and cannot be installed on a CPU-only machine:

* ``torchvision`` -- imported at module level by SGLang's multimodal config and
  preprocessing modules (``sglang.srt.configs`` -> ``internvl_utils`` etc.), which
  ``sglang.srt.mem_cache.memory_pool`` imports. The torchvision wheels on PyPI link
  against CUDA torch (``libc10_cuda.so``) and fail to load next to the CPU torch
  wheel. The radix cache never calls into it.

``install_stub_packages(["torchvision"])`` registers a meta-path finder that
answers imports of those packages (and any submodule) with empty placeholder
modules. Every attribute of a placeholder is a placeholder object that can be
called, subclassed, indexed or read further, so ``from torchvision.transforms
import InterpolationMode`` and ``T.Compose([...])`` at import time succeed. Using
one for real work would silently do nothing, which is fine only because the
cache code paths exercised by the drivers never reach them.

No peer code is copied here; this only stands in for unavailable third-party
imports.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _Placeholder:
    """An inert object usable as a value, a callable, a base class or a namespace."""

    def __init__(self, name: str = "placeholder", *args, **kwargs):
        object.__setattr__(self, "_name", name if isinstance(name, str) else "placeholder")

    def __getattr__(self, item):
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return _Placeholder(f"{self._name}.{item}")

    def __call__(self, *args, **kwargs):
        return _Placeholder(f"{self._name}()")

    def __getitem__(self, item):
        return _Placeholder(f"{self._name}[]")

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self):
        return f"<stub {self._name}>"


class _StubModule(types.ModuleType):
    def __getattr__(self, item):
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return _Placeholder(f"{self.__name__}.{item}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = set(roots)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".", 1)[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []  # make it a package so submodule imports work
        mod.__stub__ = True
        # A real-looking but ancient version: feature probes such as transformers'
        # ``is_torchvision_greater_or_equal`` parse it and then take their
        # "old/absent torchvision" branches.
        mod.__version__ = "0.0.0"
        return mod

    def exec_module(self, module):
        return None


_installed: set[str] = set()


def install_stub_packages(roots) -> list[str]:
    """Stub the given top-level packages if they are not importable for real.

    Returns the names actually stubbed (a package that imports fine is left alone).
    """
    todo = []
    for root in roots:
        if root in _installed or root in sys.modules:
            continue
        try:
            __import__(root)
        except Exception:  # missing, or present but broken (e.g. CUDA-linked wheel)
            for name in [n for n in sys.modules if n == root or n.startswith(root + ".")]:
                del sys.modules[name]
            todo.append(root)
    if todo:
        sys.meta_path.insert(0, _StubFinder(todo))
        _installed.update(todo)
    return todo
