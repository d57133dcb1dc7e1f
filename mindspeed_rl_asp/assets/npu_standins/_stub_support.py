"""Stand-ins (fakes, named as such) for MindSpeed-RL's NPU-only imports (torch_npu, vllm,
vllm_ascend, mindspeed, torchvision, latex2sympy2): any attribute or submodule exists and is
an inert class, so that MindSpeed-RL's modules import on a CPU machine. Nothing here
computes anything: code that really calls into these stacks (Megatron init, HCCL,
vllm-ascend) cannot run here, and is not meant to. ``engine.mindspeed_workers=cpu`` runs
MindSpeed-RL's orchestration with them and does the model work with the hf engine
(integrations/mindspeed/cpu_workers.py); the contract tests use them too.

Only ever put this directory on ``sys.path`` of a process that runs MindSpeed-RL's code
(integrations/mindspeed/job.use_mindspeed_rl): the stand-in named ``vllm`` would shadow a
real vllm."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _StubMeta(type):
    """A class whose missing attributes are further stub classes (``vllm.config.X.Y``)."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = stub_class(cls.__module__, f"{cls.__qualname__}.{name}")
        type.__setattr__(cls, name, value)   # the same object next time (pickled by reference)
        return value

    def __call__(cls, *args, **kwargs):
        # Used as a decorator (``@stub``): keep the decorated function.
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], type):
            return args[0]
        return super().__call__()

    def __iter__(cls):
        return iter(())

    def __bool__(cls):
        return False


def stub_class(module: str, qualname: str) -> type:
    cls = _StubMeta(qualname.rsplit(".", 1)[-1], (), {"__init__": lambda self, *a, **k: None})
    cls.__module__, cls.__qualname__ = module, qualname
    return cls


def _module_getattr(module_name: str):
    """PEP 562 ``__getattr__`` for a stub module: any missing name is an inert class, kept
    on the module so that cloudpickle (Ray) pickles it, and the module, by reference."""
    def __getattr__(name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = stub_class(module_name, name)
        setattr(sys.modules[module_name], name, value)
        return value
    return __getattr__


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every submodule of the stubbed roots (``vllm.v1.engine.core`` ...)."""

    def __init__(self):
        self.roots: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.roots and "." in fullname:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)
        return module

    def exec_module(self, module):
        pass


_FINDER = _StubFinder()


def make_stub(module_globals: dict) -> None:
    """Turn the calling package (``torch_npu/__init__.py`` ...) into a permissive stub."""
    name = module_globals["__name__"]
    module_globals["__getattr__"] = _module_getattr(name)
    _FINDER.roots.add(name)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
