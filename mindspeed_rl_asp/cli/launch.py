"""``asp-launch``: bring up a layout on a cluster (dry run by default).

    asp-launch layout=ascend910b3_t4g4 head=10.0.0.1              # print every node's command
    asp-launch layout=ascend910b3_t4g4 head=10.0.0.1 --node 3     # run node 3's `ray start` here
    asp-launch layout=ascend910b3_t4g4 head=10.0.0.1 --driver     # run the driver (on the head)

Other overrides (``experiment=``, ``steps=``, ...) are passed on to the driver command.
"""
from __future__ import annotations

import subprocess
import sys


def main(argv=None) -> int:
    from .common import UserError, run_command

    argv = list(sys.argv[1:] if argv is None else argv)
    node = None
    if "--node" in argv:
        i = argv.index("--node")
        node = int(argv[i + 1]) if i + 1 < len(argv) and argv[i + 1].isdigit() else -1
        del argv[i:i + 2]
    run_driver = "--driver" in argv
    argv = [a for a in argv if a != "--driver"]
    head = next((a.split("=", 1)[1] for a in argv if a.startswith("head=")), None)
    overrides = [a for a in argv if not a.startswith("head=")]

    def launch(cfg) -> int:
        from omegaconf import OmegaConf

        from ..runtime.launch import launch_commands

        if not head:
            raise UserError("give the head node's address: head=HOST (the machine of layout node 0)")
        layout = OmegaConf.to_object(cfg.layout)
        driver_overrides = [a for a in overrides if not a.startswith(("layout=", "mode="))]
        nodes, driver = launch_commands(layout, cfg.mode.name, head, driver_overrides)
        if node is not None:
            if not 0 <= node < len(nodes):
                raise UserError(f"--node must be one of 0..{len(nodes) - 1} for layout {layout.name}")
            print(f"node {node} ({nodes[node].units}): {nodes[node].command}", flush=True)
            return subprocess.call(nodes[node].command, shell=True)
        if run_driver:
            print(driver, flush=True)
            return subprocess.call(driver, shell=True)
        print(f"# layout {layout.name}: {layout.nodes} x {layout.devices_per_node} {layout.accelerator}, "
              f"mode={cfg.mode.name}")
        for n in nodes:
            print(f"# node {n.node} ({n.units})\n{n.command}")
        print(f"# then, on the head (node 0):\n{driver}")
        return 0

    return run_command("asp-launch", __doc__.strip().splitlines()[0], launch, overrides)


if __name__ == "__main__":
    raise SystemExit(main())
