"""Importing the package (every module of it) never pulls in an accelerator stack."""
import subprocess
import sys

FORBIDDEN = ("torch_npu", "vllm", "mindspeed", "megatron")

CHECK = """
import importlib, pkgutil, sys
import mindspeed_rl_asp
for info in pkgutil.walk_packages(mindspeed_rl_asp.__path__, "mindspeed_rl_asp."):
    importlib.import_module(info.name)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {forbidden!r})
print(",".join(loaded))
"""


def test_no_accelerator_stack_on_import():
    out = subprocess.run([sys.executable, "-c", CHECK.format(forbidden=set(FORBIDDEN))],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"imported: {out.stdout.strip()}"


def test_package_import_is_light():
    out = subprocess.run([sys.executable, "-c", "import sys, mindspeed_rl_asp; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
