"""Both MindSpeed-RL check lists in one child process (see tests/mindspeed_child.py), run by
tests/test_mindspeed_contract.py: contract_child.py's, then cpu_path_child.py's. One child
instead of one per list saves an interpreter, an ``import mindspeed_rl`` (with torch and
transformers) and a Ray start. Writes {"contract": {check: "ok" | error}, "cpu_path": {...}}
as JSON.

Usage: python all_checks_child.py OUT.json
"""
from __future__ import annotations

import sys

import contract_child
import cpu_path_child
from child_checks import write_results

# The contract's first checks need no Ray: ``import mindspeed_rl`` is checked in a process
# that has done nothing else yet.
NO_RAY = {"import_mindspeed_rl_with_stubs", "engine_api_signatures", "engine_cli_functions",
          "qkv_split_matches_mindspeed_rl", "names_match_mindspeed_rl_weight_adaptors", "fc1_gather_matches_mindspeed_rl"}


def start_ray(name: str) -> None:
    """Ray for every check after the NO_RAY ones, started once, with what both lists need:
    32 logical CPUs (GRPOTransferDock and TransferQueueManager reserve 10 each) and one
    logical NPU (the cpu workers' bundle); MindSpeed-RL on the path first, as
    engine.mindspeed_workers=cpu puts it."""
    if name in NO_RAY:
        return
    import ray

    from mindspeed_rl_asp.integrations.mindspeed.job import use_mindspeed_rl

    if ray.is_initialized():
        return
    use_mindspeed_rl("cpu")
    ray.init(num_cpus=32, resources={"NPU": 1}, include_dashboard=False, log_to_driver=False,
             configure_logging=False)


def main(out_path: str) -> int:
    import ray

    try:
        results = {"contract": contract_child.check.run(start_ray), "cpu_path": cpu_path_child.check.run(start_ray)}
    finally:
        if ray.is_initialized():
            ray.shutdown()
    return write_results(out_path, results)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
