"""``asp-launch``: bring up a layout on a cluster (dry run by default).

    asp-launch layout=ascend910b3_t4g4 head=10.0.0.1              # print every node's command
    asp-launch layout=ascend910b3_t4g4 head=10.0.0.1 --node 3     # run node 3's `ray start` here
    asp-launch layout=ascend910b3_t4g4 head=10.0.0.1 --wait       # wait until every node joined with its devices
    asp-launch layout=ascend910b3_t4g4 head=10.0.0.1 --driver     # wait, then run the driver (on the head)

``--wait-timeout S`` bounds the wait (default 1800 s; it exits 1 naming what is missing).
Authentication: every Ray process runs with ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN_PATH`` = ``--token-path PATH`` (default ``~/.ray/auth_token``: put it on
a file system every node mounts, or fill it on each node from your secret store);
``asp-launch --new-token [--token-path PATH]`` writes a random token there (mode 0600,
never printed). A head on a non-loopback address is not started without a token.
``--dashboard-host HOST`` (default 127.0.0.1: the head's loopback only).
``--mindspeed-config JOB.yaml``: a MindSpeed-RL job; the layout is the one its import maps
to (docs/mindspeed_rl.md) unless ``layout=`` is given, and the driver imports the job.
Other overrides (``experiment=``, ``steps=``, ...) are passed on to the driver command.
"""
from __future__ import annotations

import subprocess
import sys


def _take(argv: list[str], flag: str, with_value: bool):
    """Remove ``flag`` (and its value) from argv; returns the value, True, or None if absent."""
    for i, arg in enumerate(argv):
        if arg == flag:
            value = argv[i + 1] if with_value and i + 1 < len(argv) else True
            del argv[i:i + (2 if with_value and i + 1 < len(argv) else 1)]
            return value
        if with_value and arg.startswith(flag + "="):
            del argv[i]
            return arg.split("=", 1)[1]
    return None


def wait_for_layout(layout, mode_name: str, head: str, timeout_s: float) -> int:
    """Connect to the cluster at ``head`` and wait until it holds the layout (0) or time out (1)."""
    import ray

    from ..runtime.launch import RAY_PORT, describe_wait, required_resources, wait_for_cluster

    print(f"{describe_wait(layout, mode_name)} (at most {timeout_s:g} s)", flush=True)
    ray.init(address=f"{head}:{RAY_PORT}", log_to_driver=False, configure_logging=False)
    try:
        missing = wait_for_cluster(required_resources(layout, mode_name), ray.cluster_resources, timeout_s,
                                   report=lambda line: print(line, flush=True))
    finally:
        ray.shutdown()
    if missing:
        print(f"asp-launch: error: after {timeout_s:g} s the cluster still lacks {', '.join(missing)}: start "
              "those nodes (`asp-launch ... --node K` on each) or check that they reach the head", file=sys.stderr)
        return 1
    return 0


def import_job(job: str, overrides: list[str]):
    """(the composed overrides, the driver's extra arguments, the job's environment) of a
    MindSpeed-RL job: launch the layout its import maps to; the driver imports it again."""
    from ..integrations.mindspeed.config_import import import_file, merge_overrides

    result = import_file(job, None, overrides)
    return merge_overrides(result.overrides, overrides), ["--mindspeed-config", str(job)], dict(result.env)


def launch_environment(cfg, job_env: dict) -> tuple[dict, dict, list[str]]:
    """(every node's variables, the driver's, notes). engine=mindspeed runs MindSpeed-RL's
    code in Ray workers on every node: its checkout (``MINDSPEED_RL_CHECKOUT``, where the
    operator set it) goes to each ``ray start``. The job's own variables (HCCL_BUFFSIZE from
    rl_config.hccl_buffersize, as MindSpeed-RL's cli/train_grpo.py sets it) go to the driver,
    unless the operator set them (the operator's value wins, as in npu_actor_env)."""
    import importlib.util
    import os

    nodes, notes = {}, []
    if cfg.engine.name == "mindspeed":
        if os.environ.get("MINDSPEED_RL_CHECKOUT"):
            nodes["MINDSPEED_RL_CHECKOUT"] = os.environ["MINDSPEED_RL_CHECKOUT"]
        elif importlib.util.find_spec("mindspeed_rl") is None:
            notes.append("# note: engine=mindspeed runs MindSpeed-RL on every node; set MINDSPEED_RL_CHECKOUT=DIR "
                         "(its checkout, the same path on every node) before asp-launch and it is passed to each "
                         "ray start and the driver")
    return nodes, {k: v for k, v in job_env.items() if k not in os.environ}, notes


def _flags(argv: list) -> tuple:
    """asp-launch's own flags, taken out of ``argv`` (what is left are overrides):
    (node or None (-1 when not a number), --driver, --wait, --wait-timeout, --mindspeed-config,
    --new-token, --token-path, --dashboard-host)."""
    import os

    from ..runtime.launch import DASHBOARD_HOST, TOKEN_PATH

    node = _take(argv, "--node", with_value=True)
    if node is not None:
        node = int(node) if isinstance(node, str) and node.isdigit() else -1
    run_driver = bool(_take(argv, "--driver", with_value=False))
    wait_only = bool(_take(argv, "--wait", with_value=False))
    timeout = _take(argv, "--wait-timeout", with_value=True)
    job = _take(argv, "--mindspeed-config", with_value=True)
    make_token = bool(_take(argv, "--new-token", with_value=False))
    token_path = os.path.expanduser(str(_take(argv, "--token-path", with_value=True) or TOKEN_PATH))
    dashboard_host = str(_take(argv, "--dashboard-host", with_value=True) or DASHBOARD_HOST)
    return node, run_driver, wait_only, timeout, job, make_token, token_path, dashboard_host


def main(argv=None) -> int:
    import os

    from ..runtime.launch import new_token
    from .common import UserError, expected_errors, run_command

    argv = list(sys.argv[1:] if argv is None else argv)
    node, run_driver, wait_only, timeout, job, make_token, token_path, dashboard_host = _flags(argv)
    if make_token:
        made = new_token(token_path)
        print(f"asp-launch: {'wrote a new token to' if made else 'kept the token already at'} {token_path} (mode "
              "0600); every node needs this file at this path (a shared file system, or your secret store)")
        return 0
    head = next((a.split("=", 1)[1] for a in argv if a.startswith("head=")), None)
    overrides = [a for a in argv if not a.startswith("head=")]
    driver_extra, composed, job_env = [], overrides, {}
    if job is not None:
        try:
            composed, driver_extra, job_env = import_job(job, overrides)
        except expected_errors() as error:
            print(f"asp-launch: error: {error}", file=sys.stderr)
            return 2

    def launch(cfg) -> int:
        from omegaconf import OmegaConf

        from ..runtime.launch import WAIT_TIMEOUT_S, auth_env, launch_commands, token_problem

        if not head:
            raise UserError("give the head node's address: head=HOST (the machine of layout node 0)")
        try:
            timeout_s = WAIT_TIMEOUT_S if timeout is None else float(timeout)
        except (TypeError, ValueError):
            raise UserError(f"--wait-timeout must be a number of seconds, got {timeout!r}") from None
        layout = OmegaConf.to_object(cfg.layout)
        # The layout and the mode are the driver command's own (launch_commands writes them).
        driver_overrides = driver_extra + [a for a in overrides if not a.startswith(("layout=", "layout.", "mode="))]
        node_env, driver_env, notes = launch_environment(cfg, job_env)
        nodes, driver = launch_commands(layout, cfg.mode.name, head, driver_overrides, node_env, driver_env,
                                        token_path=token_path, dashboard_host=dashboard_host)
        if node is not None or wait_only or run_driver:
            problem = token_problem(head, token_path)
            if problem:
                raise UserError(problem)
            os.environ.update(auth_env(token_path))   # the wait below joins the cluster from here
        if node is not None:
            if not 0 <= node < len(nodes):
                raise UserError(f"--node must be one of 0..{len(nodes) - 1} for layout {layout.name}")
            print(f"node {node} ({nodes[node].units}): {nodes[node].command}", flush=True)
            return subprocess.call(nodes[node].command, shell=True)
        if wait_only or run_driver:
            ready = wait_for_layout(layout, cfg.mode.name, head, timeout_s)
            if ready or wait_only:
                return ready
            print(driver, flush=True)
            return subprocess.call(driver, shell=True)
        print_plan(layout, cfg.mode.name, head, timeout_s, nodes, driver, notes, token_path)
        return 0

    return run_command("asp-launch", __doc__.strip().splitlines()[0], launch, composed)


def print_plan(layout, mode_name: str, head: str, timeout_s: float, nodes, driver: str, notes,
               token_path: str) -> None:
    """The dry run: the token step, every node's command, then the head's wait and the driver."""
    from ..runtime.launch import describe_wait, wait_command

    print(f"# layout {layout.name}: {layout.nodes} x {layout.devices_per_node} {layout.accelerator}, mode={mode_name}")
    for line in notes:
        print(line)
    print(f"# first, once: a token every node reads from {token_path} (a shared file system, or your secret "
          "store; never on a command line)")
    print(f"asp-launch --new-token --token-path={token_path}")
    for n in nodes:
        print(f"# node {n.node} ({n.units})\n{n.command}")
    print(f"# then, on the head (node 0): {describe_wait(layout, mode_name)}, then start the driver\n"
          f"{wait_command(layout, mode_name, head, timeout_s, token_path)} && \\\n  {driver}")


if __name__ == "__main__":
    raise SystemExit(main())
