"""Measure the walk through ``runtime/driver.run_training``: which package files its
call tree enters ("rooms") and how often a call climbs back up into a file that is
already further up the same call chain (A -> B -> A: a callee that calls back into a
caller's module, the bounce a reader has to follow).

Method: a small real run (the tests' two-step tiny config, local Ray) under
``sys.settrace`` in the driver process only (the actors are other processes). Every
package function counts once, at its first call (module bodies run at import are not
calls). Rooms: the distinct files of those calls. A climb back up: such a call whose file
is not its caller's but is the file of a frame above the caller on the stack.
``--cfg`` restricts both to the functions handed the run's config or a node of it.

    python scripts/walk_run_training.py [--cfg] [RUN_DIR]
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

SMALL = ["task.num_prompts=24", "steps=2", "rl.global_batch_size=4", "rl.mini_batch_size=2",
         "rl.n_samples_per_prompt=2", "rl.micro_batch_size=4", "generate.sampling_config.max_tokens=96",
         "scheduler.base_batch_size=2", "scheduler.group_size=2", "mode.queue_capacity=32", "eval.num_prompts=0"]


def traced_run(run_dir: Path, only_cfg: bool) -> tuple[set[str], list[str]]:
    """(rooms, climbs: 'caller file -> callee file' of each climbing call) of ``run_training``."""
    from omegaconf import Container

    import mindspeed_rl_asp
    from mindspeed_rl_asp.config.load import load_config, make_run_dir
    from mindspeed_rl_asp.runtime import driver

    package = Path(mindspeed_rl_asp.__file__).parent
    cfg = load_config([*SMALL, f"run_dir={run_dir}"])
    out = make_run_dir(cfg, "walk")
    seen, rooms, climbs = set(), set(), []

    def name(frame) -> str | None:
        path = frame.f_code.co_filename
        return Path(path).relative_to(package).as_posix() if path.startswith(str(package)) else None

    def handed_cfg(frame) -> bool:
        code = frame.f_code
        values = (frame.f_locals.get(a) for a in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
        return any(v is cfg or (isinstance(v, Container) and v._get_root() is cfg) for v in values)

    def tracer(frame, event, arg):
        code, here = frame.f_code, name(frame)
        if event != "call" or here is None or code in seen or code.co_name == "<module>":
            return None
        if only_cfg and not handed_cfg(frame):
            return None
        seen.add(code)
        rooms.add(here)
        caller = frame.f_back
        above = []
        up = caller.f_back if caller is not None else None
        while up is not None:
            above.append(name(up))
            up = up.f_back
        if caller is not None and name(caller) not in (None, here) and here in above:
            climbs.append(f"{name(caller)} -> {here}")
        return None

    sys.settrace(tracer)
    try:
        driver.run_training(cfg, out)
    finally:
        sys.settrace(None)
    return rooms, climbs


def main(argv: list[str]) -> int:
    only_cfg = "--cfg" in argv
    rest = [a for a in argv if a != "--cfg"]
    rooms, climbs = traced_run(Path(rest[0]) if rest else Path(tempfile.mkdtemp()) / "run", only_cfg)
    print(f"rooms {len(rooms)}, climbs back up {len(climbs)}")
    print("rooms: " + ", ".join(sorted(rooms)))
    print("climbs: " + "; ".join(climbs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
