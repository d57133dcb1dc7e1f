"""Weight transport benchmark: how fast a version gets from the trainer to a generation
actor, and how long the actor stops generating for it, per ``weights.transport``.

Not a test. Prints a markdown table (pasted into docs/benchmarks.md, "Weight transport"):

    HF_HUB_OFFLINE=1 python benchmarks/bench_transport.py                  # ~300 MB model, ~5 min on 2 cores
    HF_HUB_OFFLINE=1 python benchmarks/bench_transport.py --quick          # ~40 MB, ~1 min
    HF_HUB_OFFLINE=1 python benchmarks/bench_transport.py --json out.json

A randomly initialised Qwen3 (``policy/tiny_model.tiny_qwen3_config`` at ``--hidden`` x
``--layers``, float32; the default 1024 x 6 is ~75 M parameters, ~300 MB) is saved as a
checkpoint; one real Training Unit actor (``TrainingWorker``, one rank) and one real
Generation Unit actor (``GenerationWorker``, hf engine) load it on a local Ray cluster,
one CPU each. Every measurement goes through the runtime's own path: ``RayCluster``
submits ``Publish(v)`` and ``LoadWeights(0, v)`` with the transport of ``make_transport``,
exactly as ``asp-train`` does, ``--repeats`` times per row (median reported):

* ``object_store``: rank 0 returns the snapshot as an object; the actor's call resolves
  it (Ray's fetch) and loads it.
* ``files``: rank 0 writes safetensors (renamed into place); the actor reads and loads.
* ``collective``, sent at load (``weights.prefetch=false``), one row per bucket size:
  rank 0 packs the version into its flat buffer at publish; the load waits for the
  buckets over the gloo pair group, then swaps them in.
* ``collective``, prefetched (the default): the control core's ``Prefetch`` starts the
  transfer on both transport threads right after the publish; the load, submitted once
  it ended (as the core does), only swaps. Measured twice: with the actor idle, and with
  the actor generating a minibatch while the version arrives (what ASP does), against
  the same minibatch generated without a transfer.

With ``--asp-train``, also three short real runs (``run_training``: 6 steps, 2 generation
actors, 4 prompts x 2 samples per step, 24 tokens) on the same model, one per transport,
and each actor's refresh pauses (its ``load_weights`` spans in ``timeline.jsonl``) and
round trips: the same figures with the trainer training, two actors loading at once and
everything sharing the machine (~2 min per run on 2 cores).

Columns: ``publish`` is the trainer's time from ``Publish`` to its event (snapshot,
write or pack); ``wire`` the transfer alone (collective: the receiver's bucket loop);
``pause`` the actor's ``load_weights`` span, i.e. the time it is not generating because
of the refresh; ``round trip`` from ``LoadWeights`` submitted to its event (what the
Control Unit records as refresh time; for the object store it includes Ray's fetch,
which happens before the actor's span). ``MB/s`` = model bytes / (publish + round trip),
trainer weights to actor engine; ``wire MB/s`` = bytes / wire.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}   # as runtime/driver._ray_options sets them


def med(values):
    return statistics.median(values) if values else float("nan")


def build_model(root: Path, hidden: int, layers: int) -> tuple[str, int, int]:
    """A random Qwen3 checkpoint with the maze tokenizer: (path, parameters, bytes)."""
    from transformers import Qwen3ForCausalLM

    from mindspeed_rl_asp.policy.tiny_model import tiny_qwen3_config
    from mindspeed_rl_asp.policy.tokenizer import build_tokenizer

    import torch

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(tiny_qwen3_config(tokenizer, hidden_size=hidden, num_layers=layers))
    path = root / f"random-qwen3-{hidden}x{layers}"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    params = sum(p.numel() for p in model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return str(path), params, nbytes


def start_actors(model_path: str, n_samples: int, max_tokens: int):
    from dataclasses import replace

    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.runtime.actor_configs import actor_configs
    from mindspeed_rl_asp.runtime.generation_unit import GenerationWorker
    from mindspeed_rl_asp.runtime.training_unit import TrainingWorker
    from mindspeed_rl_asp.runtime.transport import remote_class
    from mindspeed_rl_asp.schedule.configured import configured_task

    import ray

    cfg = load_config(["task.num_prompts=16", f"generate.sampling_config.max_tokens={max_tokens}",
                       "rl.global_batch_size=4", "rl.mini_batch_size=4", "scheduler.base_batch_size=2"])
    opts = {"num_cpus": 1, "max_concurrency": 1, "runtime_env": {"env_vars": ENV}}
    configs = actor_configs(cfg, configured_task(cfg), model_path)
    trainer = remote_class(TrainingWorker, "collective", "train", 1).options(**opts).remote(configs.trainer, model_path)
    gen = remote_class(GenerationWorker, "collective", "generate", 1).options(**opts).remote(
        0, replace(configs.generation, n_samples=n_samples), model_path)
    ray.get([trainer.ready.remote(), gen.ready.remote()])
    return trainer, gen


class Versions:
    """Versions only grow (the store and the files refuse anything else): one counter."""

    def __init__(self, trainer):
        self.trainer, self.v = trainer, 0

    def next(self) -> int:
        import ray

        self.v += 1
        ray.get(self.trainer.__ray_call__.remote(lambda worker, v: setattr(worker, "version", v), self.v))
        return self.v


def one_refresh(cluster, version: int, prefetch: bool = False, during=None) -> dict:
    """Publish ``version``, (optionally prefetch it, as the control core's ``Prefetch``
    does, and run ``during()`` meanwhile), then load it on actor 0; the timings of one row."""
    from mindspeed_rl_asp.control.core import LoadWeights, Prefetch, Publish
    from mindspeed_rl_asp.control.loop import Done

    t0 = time.perf_counter()
    cluster.submit(Publish(version))
    event = cluster.next_event()
    publish_s = time.perf_counter() - t0
    if not isinstance(event, Done):
        raise RuntimeError(f"publish v{version} failed: {event.error}")
    row = {"publish_s": publish_s}
    if prefetch:
        cluster.submit(Prefetch(0, version))
    if during is not None:
        row["generate_s"] = during()
    if prefetch:
        event = cluster.next_event()   # the load waits for its prefetch, as the core makes it
        if not isinstance(event, Done):
            raise RuntimeError(f"prefetch v{version} failed: {event.error}")
        row["wire_s"] = event.info["seconds"]
    t1 = time.perf_counter()
    cluster.submit(LoadWeights(0, version))
    event = cluster.next_event()
    row["round_trip_s"] = time.perf_counter() - t1
    if not isinstance(event, Done):
        raise RuntimeError(f"load v{version} failed: {event.error}")
    report = event.info
    row["pause_s"] = report.end - report.start
    row["swap_s"] = report.swap_s
    row["wait_s"] = report.wait_s
    if report.transfer_s and "wire_s" not in row:
        row["wire_s"] = report.transfer_s
    row["bytes"] = report.bytes
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--buckets", default="4,16,64,256", help="bucket sizes in MB for the collective rows")
    ap.add_argument("--quick", action="store_true", help="hidden 512 x 4 layers (~40 MB), 2 repeats, 2 buckets")
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--asp-train", action="store_true", help="also real 6-step runs, one per transport")
    args = ap.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.repeats, args.buckets = 512, 4, 2, "4,64"
    buckets = [float(b) for b in args.buckets.split(",")]

    import ray

    from mindspeed_rl_asp.runtime.ray_cluster import RayCluster
    from mindspeed_rl_asp.runtime.transport import make_transport

    work = Path(tempfile.mkdtemp(prefix="bench-transport-"))
    model_path, params, model_bytes = build_model(work, args.hidden, args.layers)
    print(f"model: random Qwen3 hidden {args.hidden} x {args.layers} layers, {params / 1e6:.1f} M parameters, "
          f"{model_bytes / 1e6:.0f} MB float32")
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
    rows = []
    try:
        trainer, gen = start_actors(model_path, n_samples=2, max_tokens=48)
        versions = Versions(trainer)
        prompts = [(f"p{i}", [5 + i, 6, 7, 8, 9, 10, 11, 12]) for i in range(4)]

        def generate() -> float:
            t = time.perf_counter()
            report, _ = gen.generate.options(num_returns=2).remote("bench", prompts, 0)
            ray.get(report)
            return time.perf_counter() - t

        def measure(name, bucket_mb=None, prefetch=False, during=None, repeats=args.repeats):
            weights = SimpleNamespace(transport=name, bucket_mb=bucket_mb or 64.0, prefetch=prefetch,
                                      timeout_s=300.0, dir=str(work / "weights"))
            transport = make_transport(weights, [trainer], [gen], work, "cpu", local=True)
            cluster = RayCluster([gen], [trainer], {}, 0, transport)
            one_refresh(cluster, versions.next(), prefetch=prefetch)   # warm-up
            samples = [one_refresh(cluster, versions.next(), prefetch=prefetch, during=during)
                       for _ in range(repeats)]
            label = name if name != "collective" else (
                f"collective, {bucket_mb:g} MB buckets, " + ("prefetched" if prefetch else "sent at load"))
            if during is not None:
                label += ", actor generating"
            row = {"transport": label, "bytes": model_bytes,
                   **{k: med([s[k] for s in samples if k in s]) for k in samples[0] if k != "bytes"}}
            rows.append(row)
            print(f"  {label}: publish {row['publish_s']:.3f} s, pause {row['pause_s']:.3f} s, "
                  f"round trip {row['round_trip_s']:.3f} s", flush=True)

        measure("object_store")
        measure("files")
        for b in buckets:
            measure("collective", b)
        measure("collective", 64.0, prefetch=True)
        generate()  # warm
        alone = [generate() for _ in range(args.repeats)]
        measure("collective", 64.0, prefetch=True, during=generate)
    finally:
        ray.shutdown()   # the real runs below start their own cluster

    print()
    print(f"Model: {params / 1e6:.1f} M parameters, {model_bytes / 1e6:.0f} MB (float32). Median of {args.repeats}.")
    print()
    print("| transport | publish (s) | wire (s) | actor pause (s) | round trip (s) | MB/s | wire MB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        mb = r["bytes"] / 1e6
        wire = r.get("wire_s")
        print(f"| {r['transport']} | {r['publish_s']:.3f} | {'' if wire is None else f'{wire:.3f}'} | "
              f"{r['pause_s']:.3f} | {r['round_trip_s']:.3f} | {mb / (r['publish_s'] + r['round_trip_s']):.0f} | "
              f"{'' if not wire else f'{mb / wire:.0f}'} |")
    overlapped = [r for r in rows if "generating" in r["transport"]]
    if overlapped:
        print()
        print(f"A minibatch (4 prompts x 2 samples x 48 tokens) takes {med(alone):.3f} s alone and "
              f"{overlapped[0]['generate_s']:.3f} s while a version arrives on the transport thread.")
    runs = asp_train_runs(model_path, work) if args.asp_train else []
    if runs:
        print()
        print("Real runs (asp-train, 6 steps, 2 generation actors), per actor: refresh pauses "
              "(load_weights spans) and round trips, mean / max in seconds")
        print()
        print("| transport | actor | refreshes | pause mean | pause max | round trip mean | wall (s) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for run in runs:
            for actor, a in sorted(run["actors"].items()):
                print(f"| {run['transport']} | {actor} | {a['n']} | {a['pause_mean']:.3f} | {a['pause_max']:.3f} | "
                      f"{a['round_trip_mean']:.3f} | {run['wall_s']:.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"model_bytes": model_bytes, "params": params, "rows": rows,
                                               "generate_alone_s": med(alone), "runs": runs}, indent=2) + "\n")
    return 0


def asp_train_runs(model_path: str, work: Path) -> list[dict]:
    """One short real run per transport; each actor's load_weights spans."""
    from mindspeed_rl_asp.config.load import load_config, make_run_dir
    from mindspeed_rl_asp.runtime.driver import run_training

    runs = []
    for transport in ("object_store", "files", "collective"):
        cfg = load_config([f"model.path={model_path}", "task.num_prompts=32", "steps=6", "rl.global_batch_size=4",
                           "rl.mini_batch_size=4", "rl.n_samples_per_prompt=2", "rl.micro_batch_size=8",
                           "generate.sampling_config.max_tokens=24", "scheduler.base_batch_size=2",
                           "scheduler.group_size=2", "mode.queue_capacity=32", "eval.num_prompts=0",
                           "eval.save_final_policy=false", f"weights.transport={transport}",
                           f"run_dir={work / ('run-' + transport)}"])
        run_dir = make_run_dir(cfg, "bench")
        summary = run_training(cfg, run_dir)
        spans = [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]
        actors = {}
        for lane in sorted({s["lane"] for s in spans if s["kind"] == "load_weights"}):
            loads = [s for s in spans if s["lane"] == lane and s["kind"] == "load_weights"]
            pauses = [s["end"] - s["start"] for s in loads]
            actors[lane] = {"n": len(loads), "pause_mean": statistics.mean(pauses), "pause_max": max(pauses),
                            "round_trip_mean": statistics.mean(s["info"]["round_trip_s"] for s in loads)}
        runs.append({"transport": transport, "wall_s": summary["wall_time_s"], "actors": actors})
        print(f"  asp-train {transport}: {summary['steps']} steps in {summary['wall_time_s']:.1f} s", flush=True)
    return runs


if __name__ == "__main__":
    sys.exit(main())
