"""Stand-in for AscendCL (``acl``) on a machine without NPUs. ``acl.rt.get_device_count()``
answers (count, return code): the count is ``ASP_LOGICAL_NPUS_PER_NODE`` (set for the
processes of ``engine.mindspeed_workers=cpu``, whose NPUs are Ray logical resources), else 0.
Ray's NPU detection and MindSpeed-RL's ``get_device_information`` ask it."""
import os
from types import SimpleNamespace


def _device_count():
    return int(os.environ.get("ASP_LOGICAL_NPUS_PER_NODE", "0") or 0), 0


rt = SimpleNamespace(get_device_count=_device_count)


def get_soc_name():
    return None
