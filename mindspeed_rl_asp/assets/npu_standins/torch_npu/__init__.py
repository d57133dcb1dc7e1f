"""Stub of torch_npu for MindSpeed-RL contract tests (see _stub_support.py)."""
from _stub_support import make_stub

make_stub(globals())
__version__ = "0.0.0+stub"
