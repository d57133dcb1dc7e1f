"""Stub of AscendCL (``acl``): a machine without NPUs. Ray's NPU detection asks
``acl.rt.get_device_count()`` (count, return code) and ``acl.get_soc_name()``."""
from types import SimpleNamespace

rt = SimpleNamespace(get_device_count=lambda: (0, 0))


def get_soc_name():
    return None
