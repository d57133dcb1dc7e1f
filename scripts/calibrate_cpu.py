"""Calibrate the simulator's cpu_local profile and the hf engine profile on this machine.

Profiles the machine with the project's own hf engine and the shipped tiny maze policy
(``mindspeed_rl_asp/assets/tiny-maze-qwen3``, one torch thread as the runs use), fits the
simulator's constants from the measurements, prints both, and with ``--write`` writes
them into ``configs/hardware/cpu_local.yaml`` and the measured entries of
``configs/engine/hf.yaml`` with a ``sources`` text that says what was measured, how,
when and with which command::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/calibrate_cpu.py            # measure, fit, print (~4 min idle)
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/calibrate_cpu.py --write    # ... and update the two yaml files
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/calibrate_cpu.py --refit runs/calibrate_cpu.json --write
                                                                          # fit and write saved measurements

The raw measurements are saved first (``--json``, default ``runs/calibrate_cpu.json``),
so a fit can be redone without measuring again (``--refit``).

**Clock.** Every compute measurement runs in this one process on one torch thread and is
timed twice: wall clock and the process's CPU time. On a machine shared with other jobs
the wall clock also counts the time the process waited for a core; the CPU time is what
the work takes on a core of its own, which is what the simulator's profile describes
(it models the run's own processes, not other jobs). ``--clock cpu`` (default) fits the
CPU times, ``--clock wall`` the wall times (the same thing on an idle machine; the report
prints both and their ratio). The Ray round trips span processes and are wall clock:
with ``--clock cpu`` the least-disturbed (minimum) of the repeats is used, with
``--clock wall`` the median. Ray workers run at the niceness of this process
(``RAY_worker_niceness``; Ray's default would be 15).

What is measured (medians over repeats, one torch thread):

1. **Peak** (the "peak" MFU is measured against): a float32 2048 x 2048 matmul, FLOP/s
   (``2 n^3 / t``). The tiny policy runs in float32 on this CPU, so the key
   ``peak_bf16_tflops`` holds this single-thread float32 matmul rate: an achieved
   rate, not a datasheet peak, so the efficiencies below are shares of what one core
   really reaches on a large matmul.
2. **Memory bandwidth**: ``dst.copy_(src)`` of a 256 MiB float32 tensor, bytes read +
   written per second (STREAM "copy" counting) -> ``hbm_bandwidth_gbs``.
3. **Generation** (``HFGenerationEngine.generate``, the engine the runs use): calls shaped
   as the runs' minibatches, ``k`` task prompts drawn at random, each repeated 4 times
   (the samples), left-padded to the longest by the engine, for ``k`` in
   ``PROMPTS_PER_CALL`` (two draws each) and one prompt alone; the end-of-text token
   suppressed (``min_new_tokens = max_new_tokens = N``, a ``GenerationConfig`` wrapper
   around the engine's own call) so that every row decodes exactly ``N`` tokens, ``N``
   in ``DECODE_SERIES``. Uniform batches (one prompt repeated) would miss what padding
   costs: the padded batch's attention mask.
4. **Training**: the real ``runtime/training_unit.TrainingWorker`` (in this process, no
   Ray) runs ``train_step`` on steps of 8 prompts x 4 samples that the engine sampled
   from the task prompts in data order (GRPO loss with TIS, the no-grad forward for the
   proximal log-probs, one AdamW update, reward scoring: what the trainer does); time per
   trained token, tokens counted as the simulator counts them (prompt + response,
   unpadded). The first step is a warm-up.
5. **Weight sync**: in process, ``export_weights()`` of the trainer and
   ``load_weights(snapshot)`` of the generation engine; and through Ray as the runtime
   does it (``TrainingWorker.export_weights`` returned into the object store and waited
   on until sealed, as ``runtime/ray_cluster`` publishes; then
   ``GenerationWorker.load_weights(version, ref)`` until it returns; and a no-op actor
   call, ``ready()``), in one local Ray cluster that is shut down at the end.

What is fitted: on this CPU one core runs the framework, the operator dispatch and the
kernels one after another, so the hf engine's profile is ``execution: serial``: a
generate call costs ``call overhead + prefill + (N - 1) decode steps``, a prefill
``weights read + (2 x matmul params x b P + attention) / (peak x eff_p)``, a decode step ``overhead +
2 x matmul params x b / (peak x eff_c) + (weights + cached tokens x kv bytes) / (bw x
eff_bw)`` (``sim/costs.decode_step_parts``, ``sim/batching.static_minibatch``). That price
is linear in five coefficients (per call, per prefill token, per step, per row-step, per
cached token read), fitted to every measured call by least squares on the relative error
with each coefficient held at or above what the machine allows (its FLOPs at the
measured peak, its bytes at the measured bandwidth); the coefficients are then read as
``engine.call_overhead_s``, ``hardware.prefill_compute_efficiency``,
``engine.decode_step_overhead_s``, ``hardware.inference_compute_efficiency`` and
``hardware.inference_bandwidth_efficiency``, and the report re-prices every call with
the simulator's own functions. ``training_mfu`` = the step's FLOPs as
``sim/costs.padded_training_time`` counts them for the padded hf trainer (update over
micro-batches, proximal forward over the step, each padded to its longest row; attention
included) / its time / peak, median over the steps. ``hardware.host_cores``: the cores
this process may run on; the simulator shares them among the run's busy processes
(``sim/cluster.py``). Weight sync: the Ray publish round trip is
``engine.weight_sync_fixed_s`` (the simulator's Publish), the weight bytes over the Ray
load round trip the node bandwidths (the simulator's LoadWeights is ``bytes /
bandwidth``; on one host the colocated and the "inter-node" path are the same Ray object
store), the no-op round trip the hybrid hand-over ``engine.mode_switch_s`` (nothing is
offloaded on a CPU).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HARDWARE_YAML = REPO / "configs" / "hardware" / "cpu_local.yaml"
ENGINE_YAML = REPO / "configs" / "engine" / "hf.yaml"
PROMPTS_PER_CALL = (1, 2, 3, 4, 5, 6, 8)   # prompts per generate call (x SAMPLES rows): the runs take 3 to 5
DECODE_SERIES = (1, 17, 65)               # tokens decoded per row (EOS suppressed)
DECODE_TOKENS = 65                        # --composition-check
TRAIN_PROMPTS = 320           # the benchmark's task.num_prompts
STEP_PROMPTS, SAMPLES = 8, 4  # rl.global_batch_size x rl.n_samples_per_prompt of the runs
STEP_MICRO_BATCH = 8          # rl.micro_batch_size of the runs (configs/config.yaml)
RAY_REPS = 20


def log(msg: str) -> None:
    print(f"[calibrate_cpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(values) -> float:
    return float(statistics.median(list(values)))


def table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def timed(fn, *args, **kwargs):
    """(wall seconds, CPU seconds of this process, result)."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t0, time.process_time() - c0, out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


# ---------------------------------------------------------------------- machine
def measure_peak(reps: int) -> dict:
    import torch

    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    runs = [timed(torch.mm, a, b)[:2] for _ in range(reps)]
    return {"n": n, "flop": 2.0 * n ** 3, "wall_s": median(w for w, _ in runs), "cpu_s": median(c for _, c in runs),
            "reps": reps}


def measure_bandwidth(reps: int) -> dict:
    import torch

    n = 64 * 2 ** 20  # 64 Mi floats = 256 MiB
    src, dst = torch.randn(n), torch.empty(n)
    dst.copy_(src)
    runs = [timed(dst.copy_, src)[:2] for _ in range(reps)]
    return {"bytes": 2.0 * 4 * n, "wall_s": median(w for w, _ in runs), "cpu_s": median(c for _, c in runs),
            "reps": reps}


# ---------------------------------------------------------------------- generation
class ForcedLength:
    """Context manager: every ``GenerationConfig`` built inside has ``min_new_tokens =
    max_new_tokens``, so ``HFGenerationEngine.generate`` decodes exactly that many tokens."""

    def __enter__(self):
        import transformers

        self._module, self._orig = transformers, transformers.GenerationConfig
        orig = self._orig

        class Forced(orig):
            def __init__(self, **kwargs):
                if kwargs.get("max_new_tokens"):
                    kwargs["min_new_tokens"] = kwargs["max_new_tokens"]
                super().__init__(**kwargs)

        transformers.GenerationConfig = Forced
        return self

    def __exit__(self, *exc):
        self._module.GenerationConfig = self._orig
        return False


def minibatch_shapes(prompt_ids: list[list[int]], seed: int = 0) -> list[tuple[str, list[list[int]]]]:
    """The generate calls to time: batches built as the runs build them (``k`` task
    prompts drawn at random, each repeated ``SAMPLES`` times, left-padded to the longest
    by the engine), for ``k`` in ``PROMPTS_PER_CALL``, two draws each, plus one prompt
    alone (batch 1)."""
    import random

    rng = random.Random(seed)
    shapes = [("1 x 1", [prompt_ids[rng.randrange(len(prompt_ids))]])]
    for k in PROMPTS_PER_CALL:
        for draw in range(2):
            chosen = rng.sample(prompt_ids, k)
            shapes.append((f"{k} x {SAMPLES} #{draw}", [ids for ids in chosen for _ in range(SAMPLES)]))
    return shapes


def measure_generation(engine, shapes: list[tuple[str, list[list[int]]]], reps: int) -> list[dict]:
    """Per (shape, N): the medians of ``reps`` calls that decode exactly N tokens a row, wall and CPU."""
    from tqdm import tqdm

    from mindspeed_rl_asp.engines.base import SamplingParams

    bar = tqdm(total=len(shapes) * len(DECODE_SERIES) * reps, desc="generate", unit="call", file=sys.stderr)
    rows = []
    with ForcedLength():
        engine.generate([shapes[0][1][0]], SamplingParams(max_tokens=8, seed=0))  # warm-up
        for name, batch in shapes:
            for n in DECODE_SERIES:
                runs = []
                for r in range(reps):
                    w, c, out = timed(engine.generate, batch, SamplingParams(max_tokens=n, seed=r))
                    if any(length != n for length in out.response_lengths):
                        raise RuntimeError(f"forced length failed: asked {n}, got {set(out.response_lengths)}")
                    runs.append((w, c))
                    bar.update(1)
                rows.append({"shape": name, "batch": len(batch), "prompt_tokens": [len(ids) for ids in batch],
                             "padded_prompt": max(len(ids) for ids in batch), "decode_tokens": n,
                             "wall_s": median(x[0] for x in runs), "cpu_s": median(x[1] for x in runs)})
                bar.set_postfix(shape=name, n=n, ms=f"{1e3 * rows[-1]['cpu_s']:.0f}")
    bar.close()
    return rows


def _corun_loop(model_path: str, batch: list[list[int]], tokens: int, ready, stop) -> None:
    """The co-runner: a second process making the same generate calls until told to stop."""
    import torch

    torch.set_num_threads(1)
    from mindspeed_rl_asp.engines.base import SamplingParams
    from mindspeed_rl_asp.engines.hf import HFGenerationEngine

    engine = HFGenerationEngine(model_path, num_threads=1)
    calls = 0
    with ForcedLength():
        engine.generate(batch, SamplingParams(max_tokens=tokens, seed=0))
        ready.set()
        while not stop.is_set():
            engine.generate(batch, SamplingParams(max_tokens=tokens, seed=calls))
            calls += 1


def measure_corun(engine, model_path: str, batch: list[list[int]], reps: int, corunners: int,
                  tokens: int = 17) -> dict:
    """CPU seconds of one generate call (a runs-sized minibatch) alone, beside 1 .. ``corunners``
    processes making the same calls, then alone again. With as many co-runners as there
    are other cores, every core is busy: they share the host's last-level cache and memory
    bandwidth (and on a virtual machine perhaps physical cores), so each runs slower than
    alone (``hardware.corun_slowdown``). With one more, the cores are time-sliced between
    more threads than cores, and every switch costs cache refills, which raises the CPU
    time of the same work again (``hardware.timeslice_slowdown``)."""
    import multiprocessing

    from mindspeed_rl_asp.engines.base import SamplingParams

    def calls() -> list[float]:
        with ForcedLength():
            return [timed(engine.generate, batch, SamplingParams(max_tokens=tokens, seed=r))[1] for r in range(reps)]

    before = calls()
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs, beside = [], {}
    try:
        for k in range(1, corunners + 1):
            ready = ctx.Event()
            proc = ctx.Process(target=_corun_loop, args=(model_path, batch, tokens, ready, stop), daemon=True)
            proc.start()
            procs.append(proc)
            if not ready.wait(300):
                raise RuntimeError("a co-running process did not start within 300 s")
            beside[k] = median(calls())
    finally:
        stop.set()
        for proc in procs:
            proc.join(120)
    after = calls()
    return {"rows": len(batch), "tokens": tokens, "reps": reps, "alone_cpu_s": median(before + after),
            "beside_cpu_s": beside, "before_cpu_s": median(before), "after_cpu_s": median(after)}


def slowdowns(corun: dict, cores: int) -> tuple[float, float]:
    """(corun_slowdown, timeslice_slowdown) from :func:`measure_corun`'s medians: beside
    ``cores - 1`` co-runners every core is busy, ``t = t0 (1 + s (cores - 1))``; beside
    ``cores`` the threads outnumber the cores, ``t = t0 (1 + s (cores - 1)) (1 + sigma)``."""
    beside = {int(k): v for k, v in corun["beside_cpu_s"].items()}
    t0 = corun["alone_cpu_s"]
    full = beside.get(cores - 1, t0)
    s = max(0.0, (full / t0 - 1.0) / max(cores - 1, 1))
    sigma = max(0.0, beside[cores] / (t0 * (1.0 + s * (cores - 1))) - 1.0)
    return s, sigma


# ---------------------------------------------------------------------- training
def measure_training(cfg, model_path: str, steps: int) -> tuple[dict, object, object]:
    """Real ``TrainingWorker.train_step`` on sampled steps; returns (measurements, worker, engine)."""
    import numpy as np

    from mindspeed_rl_asp.engines.base import SamplingParams
    from mindspeed_rl_asp.engines.hf import HFGenerationEngine
    from mindspeed_rl_asp.runtime.generation_unit import SampleGroup
    from mindspeed_rl_asp.runtime.actor_configs import actor_configs
    from mindspeed_rl_asp.runtime.training_unit import TrainingWorker
    from mindspeed_rl_asp.schedule.configured import configured_task
    from mindspeed_rl_asp.tasks import make_task_prompts

    prompts = make_task_prompts(cfg.task)
    engine = HFGenerationEngine(model_path, num_threads=1)
    tok = engine.tokenizer
    worker = TrainingWorker(actor_configs(cfg, configured_task(cfg), model_path).trainer, model_path)
    sampling = SamplingParams.from_config(cfg.generate.sampling_config)
    rows = []
    for step in range(steps):
        chunk = prompts[step * STEP_PROMPTS:(step + 1) * STEP_PROMPTS]
        ids = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in chunk]
        flat = [i for i in ids for _ in range(SAMPLES)]
        out = engine.generate(flat, SamplingParams(sampling.max_tokens, sampling.temperature, sampling.top_p,
                                                   sampling.top_k, seed=step))
        payload = {}
        for k, (p, pid) in enumerate(zip(chunk, ids)):
            sl = range(k * SAMPLES, (k + 1) * SAMPLES)
            payload[p.id] = SampleGroup(p.id, np.asarray(pid, dtype=np.int32),
                                        [np.asarray(out.response_ids[r], dtype=np.int32) for r in sl],
                                        [np.asarray(out.response_logprobs[r], dtype=np.float32) for r in sl], 0)
        prompt_tokens = SAMPLES * sum(len(i) for i in ids)
        response_tokens = sum(out.response_lengths)
        squares = sum((len(ids[r // SAMPLES]) + length) ** 2 for r, length in enumerate(out.response_lengths))
        wall, cpu, report = timed(worker.train_step, step, [p.id for p in chunk], payload)
        rows.append({"step": step, "prompt_tokens": prompt_tokens, "response_tokens": response_tokens,
                     "tokens": prompt_tokens + response_tokens, "squares": squares, "wall_s": wall, "cpu_s": cpu,
                     "prompt_lengths": [len(ids[r // SAMPLES]) for r in range(len(flat))],
                     "response_lengths": list(out.response_lengths)})
        log(f"  train step {step}: {prompt_tokens} prompt + {response_tokens} response tokens, wall {wall:.3f} s, "
            f"cpu {cpu:.3f} s" + (" (warm-up, not counted)" if step == 0 else ""))
    return {"steps": rows}, worker, engine


def measure_weights_in_process(worker, engine, reps: int) -> dict:
    runs = []
    for _ in range(reps):
        we, ce, snap = timed(worker.export_weights)
        wl, cl, _ = timed(engine.load_weights, snap)
        runs.append((we, ce, wl, cl))
    return {"export_wall_s": median(r[0] for r in runs), "export_cpu_s": median(r[1] for r in runs),
            "load_wall_s": median(r[2] for r in runs), "load_cpu_s": median(r[3] for r in runs), "reps": reps}


def measure_weights_ray(cfg, model_path: str, reps: int, niceness: int) -> dict:
    """The runtime's path: TrainingWorker.export_weights -> sealed object -> GenerationWorker.load_weights."""
    os.environ["RAY_worker_niceness"] = str(niceness)
    import ray

    from mindspeed_rl_asp.runtime.actor_configs import actor_configs
    from mindspeed_rl_asp.runtime.generation_unit import GenerationWorker
    from mindspeed_rl_asp.runtime.training_unit import TrainingWorker
    from mindspeed_rl_asp.schedule.configured import configured_task

    # The actors' environment as runtime/driver._ray_options sets it.
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}
    opts = {"num_cpus": 1, "max_concurrency": 1, "runtime_env": {"env_vars": env}}
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        configs = actor_configs(cfg, configured_task(cfg), model_path)
        gen = ray.remote(GenerationWorker).options(**opts).remote(0, configs.generation, model_path)
        trainer = ray.remote(TrainingWorker).options(**opts).remote(configs.trainer, model_path)
        ray.get([gen.ready.remote(), trainer.ready.remote()])
        pings, publishes, loads = [], [], []
        for k in range(5 + reps):  # 5 warm-ups
            t0 = time.perf_counter()
            ray.get(gen.ready.remote())
            t1 = time.perf_counter()
            ref = trainer.export_weights.remote()
            ray.wait([ref], fetch_local=False)
            t2 = time.perf_counter()
            ray.get(gen.load_weights.remote(0, ref))
            t3 = time.perf_counter()
            del ref
            if k >= 5:
                pings.append(t1 - t0)
                publishes.append(t2 - t1)
                loads.append(t3 - t2)
    finally:
        ray.shutdown()
    return {"ping_s": pings, "publish_s": publishes, "load_s": loads, "reps": reps}


def composition_check(cfg, model_path: str, minibatches: int, reps: int) -> list[dict]:
    """Decode step of real minibatches (4 data-order prompts x 4 samples, left-padded to the
    longest, as the runs batch them) against 16 copies of the longest of the four (what the
    calibration series measure and the simulator prices: rows x the padded prompt)."""
    from mindspeed_rl_asp.engines.base import SamplingParams
    from mindspeed_rl_asp.engines.hf import HFGenerationEngine
    from mindspeed_rl_asp.tasks import make_task_prompts

    engine = HFGenerationEngine(model_path, num_threads=1)
    prompts = make_task_prompts(cfg.task)
    rows = []
    with ForcedLength():
        for k in range(minibatches):
            ids = [engine.tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
                   for p in prompts[SAMPLES * k:SAMPLES * (k + 1)]]
            longest = max(ids, key=len)
            row = {"prompt_tokens": [len(i) for i in ids]}
            for name, batch in (("mixed", [i for i in ids for _ in range(SAMPLES)]), ("same", [longest] * 16)):
                for n in (1, DECODE_TOKENS):
                    row[f"{name}_{n}_cpu_s"] = median(timed(engine.generate, batch, SamplingParams(max_tokens=n, seed=r))[1]
                                                      for r in range(reps))
                row[f"{name}_step_cpu_s"] = (row[f"{name}_{DECODE_TOKENS}_cpu_s"] - row[f"{name}_1_cpu_s"]) / (
                    DECODE_TOKENS - 1)
            rows.append(row)
            log(f"  minibatch {k} prompts {row['prompt_tokens']}: step {1e3 * row['mixed_step_cpu_s']:.2f} ms mixed, "
                f"{1e3 * row['same_step_cpu_s']:.2f} ms 16 x the longest")
    return rows


def measure(args, cfg, model_path: str) -> dict:
    import torch
    import transformers

    from mindspeed_rl_asp.engines.hf import HFGenerationEngine
    from mindspeed_rl_asp.tasks import make_task_prompts

    reps = 2 if args.quick else 3
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    machine = (f"{os.cpu_count()} cores of '{cpu_model()}' (shared), torch {torch.__version__}, transformers "
               f"{transformers.__version__}, niceness {os.nice(0)}")
    log(f"{machine}; load average {load_start:.2f}")
    log("peak: float32 matmul 2048 x 2048, 1 thread")
    peak = measure_peak(reps + 2)
    log(f"  {peak['flop'] / peak['cpu_s'] / 1e9:.1f} GFLOP/s (cpu), {peak['flop'] / peak['wall_s'] / 1e9:.1f} (wall)")
    log("memory bandwidth: copy of 256 MiB, 1 thread")
    bw = measure_bandwidth(reps + 2)
    log(f"  {bw['bytes'] / bw['cpu_s'] / 1e9:.2f} GB/s (cpu), {bw['bytes'] / bw['wall_s'] / 1e9:.2f} (wall)")

    engine = HFGenerationEngine(model_path, num_threads=1)
    prompt_ids = [engine.tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
                  for p in make_task_prompts(cfg.task)]
    shapes = minibatch_shapes(prompt_ids)
    log(f"generation: {len(shapes)} batches of k random task prompts x {SAMPLES} samples (k in {PROMPTS_PER_CALL}, "
        f"two draws each, and one prompt alone), N in {DECODE_SERIES} tokens, {reps} repeats")
    generation = measure_generation(engine, shapes, reps)
    corun_batch = next(batch for name, batch in shapes if name.startswith(f"4 x {SAMPLES}"))
    cores = len(os.sched_getaffinity(0))
    log(f"co-running: a {len(corun_batch)}-row call alone, beside 1..{cores} processes making the same calls, alone "
        f"again")
    corun = measure_corun(engine, model_path, corun_batch, 8 if args.quick else 15, cores)
    log(f"  {1e3 * corun['alone_cpu_s']:.1f} ms alone, "
        + ", ".join(f"{1e3 * t:.1f} ms beside {k}" for k, t in corun["beside_cpu_s"].items()))
    del engine

    steps = 4 if args.quick else 7
    log(f"training: TrainingWorker.train_step on {steps} sampled steps of {STEP_PROMPTS} prompts x {SAMPLES} samples")
    training, worker, gen_engine = measure_training(cfg, model_path, steps)
    log("weights in process: export_weights / load_weights")
    in_process = measure_weights_in_process(worker, gen_engine, 20)
    del worker, gen_engine
    log("weights through Ray: publish (export -> sealed), load (load_weights round trip), no-op call")
    ray_w = measure_weights_ray(cfg, model_path, 10 if args.quick else RAY_REPS, os.nice(0))
    return {"date": time.strftime("%Y-%m-%d"), "time": time.strftime("%H:%M"), "machine": machine,
            "host_cores": len(os.sched_getaffinity(0)), "corun": corun,
            "quick": args.quick, "reps": reps, "load_average": [load_start, os.getloadavg()[0]],
            "seconds": time.perf_counter() - started, "peak": peak, "bandwidth": bw, "generation": generation,
            "training": training, "weights_in_process": in_process, "weights_ray": ray_w}


# ---------------------------------------------------------------------- fit
def call_features(model, rows: list[dict]):
    """Per generate call, what the serial price (sim/batching.static_minibatch with
    ``execution: serial``) is linear in: 1 (the call), prefill tokens ``b x P`` with the
    prefill's attention in token equivalents (``attention coefficient x b P^2 / (2 x
    matmul params)``: the same FLOPs at the same efficiency), decode steps ``N - 1``,
    row-steps ``b (N - 1)``, and the cached tokens the steps read, ``sum_j b (P + 1 + j)``
    (the cache grows from ``b (P + 1)`` by ``b`` a step)."""
    import numpy as np

    attention = model.attention_flops_coefficient / (2.0 * model.matmul_params)
    feats = []
    for r in rows:
        b, P, steps = r["batch"], r["padded_prompt"], r["decode_tokens"] - 1
        kv = b * (steps * (P + 1) + steps * (steps - 1) / 2.0)
        feats.append([1.0, b * P + attention * b * P * P, steps, b * steps, kv])
    return np.array(feats, dtype=float)


def bounded_least_squares(a, y, lower):
    """Least squares with every coefficient >= its lower bound: solve for the excess over
    the bounds, pin the most negative excess to 0, repeat."""
    import numpy as np

    lower = np.asarray(lower, dtype=float)
    rest = y - a @ lower
    free = list(range(a.shape[1]))
    excess = np.zeros(a.shape[1])
    while free:
        sol, *_ = np.linalg.lstsq(a[:, free], rest, rcond=None)
        if sol.min() >= 0:
            excess[free] = sol
            break
        free.pop(int(np.argmin(sol)))
    return lower + excess


def fit_generation(model, rows: list[dict], clock: str, peak: float, bandwidth: float) -> dict:
    """The serial price's five coefficients, fitted to every measured call (squared
    relative error, each at least what the machine's peak allows), then read as profile
    constants:

    - per cached token per step ``kv bytes / (bandwidth x eff_bw)`` -> ``inference_bandwidth_efficiency``;
    - per row per step ``2 x matmul params / (peak x eff_c)`` -> ``inference_compute_efficiency``;
    - per prefill token ``2 x matmul params / (peak x eff_p)`` -> ``prefill_compute_efficiency``;
    - per step ``overhead + weights / (bandwidth x eff_bw)`` -> ``engine.decode_step_overhead_s``;
    - per call ``call overhead + weights / (bandwidth x eff_bw)`` (the prefill's weight read) ->
      ``engine.call_overhead_s``."""
    import numpy as np

    a = call_features(model, rows)
    y = np.array([r[f"{clock}_s"] for r in rows])
    # No rate beats the machine: a row-step or a prefill token costs at least its matmul
    # FLOPs at the measured peak, a cached token at least its bytes at the copy bandwidth,
    # a step and a call at least one read of the weights (without these floors the
    # cached-token and row-step columns, both growing with b, trade off against each other).
    flop_floor, weight_read = 2.0 * model.matmul_params / peak, model.dense_weight_bytes / bandwidth
    lower = [weight_read, flop_floor, weight_read, flop_floor, model.kv_bytes_per_token / bandwidth]
    x = bounded_least_squares(a / y[:, None], np.ones_like(y), lower)
    call, per_prefill, per_step, per_row, per_kv = (float(v) for v in x)
    if min(per_prefill, per_row, per_kv) <= 0:
        raise RuntimeError(f"the generation fit has a zero rate (prefill {per_prefill}, row {per_row}, cache {per_kv}); "
                           "measure again on a quieter machine")
    e_bw = model.kv_bytes_per_token / (per_kv * bandwidth)
    weights = model.dense_weight_bytes / (bandwidth * e_bw)
    overhead, call_overhead = per_step - weights, call - weights
    if min(overhead, call_overhead) <= 0 or e_bw > 1:
        raise RuntimeError(f"the fit does not read as a serial step (weights {1e3 * weights:.3f} ms per read, step "
                           f"constant {1e3 * per_step:.3f} ms, call constant {1e3 * call:.3f} ms, bandwidth share "
                           f"{e_bw:.3f}); measure again on a quieter machine")
    fitted = a @ x
    rel = fitted / y - 1.0
    return {"overhead_s": overhead, "call_overhead_s": call_overhead, "bandwidth_efficiency": e_bw,
            "compute_efficiency": 2.0 * model.matmul_params / (per_row * peak),
            "prefill_efficiency": 2.0 * model.matmul_params / (per_prefill * peak),
            "coefficients": {"call_s": call, "prefill_token_s": per_prefill, "step_s": per_step,
                             "row_step_s": per_row, "cached_token_step_s": per_kv},
            "rms_relative_error": float(np.sqrt(np.mean(rel ** 2))), "max_relative_error": float(np.abs(rel).max()),
            "calls": len(y)}


def step_seconds_at_peak(model, peak: float, step: dict) -> float:
    """A measured train step's seconds at MFU 1: what ``sim/costs.padded_training_time``
    prices it at with ``training_mfu = 1``."""
    from mindspeed_rl_asp.sim.costs import padded_training_time
    from mindspeed_rl_asp.sim.profiles import HardwareProfile

    ideal = HardwareProfile("peak", peak, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1)
    return padded_training_time(model, ideal, 1, step["prompt_lengths"], step["response_lengths"],
                                STEP_MICRO_BATCH, extra_forwards=1)


def fit(raw: dict, model, clock: str) -> dict:
    from mindspeed_rl_asp.sim.profiles import GB, GIB, TERA

    key = f"{clock}_s"
    peak = raw["peak"]["flop"] / raw["peak"][key]
    bandwidth = raw["bandwidth"]["bytes"] / raw["bandwidth"][key]
    decode = fit_generation(model, raw["generation"], clock, peak, bandwidth)
    measured_steps = raw["training"]["steps"][1:]
    train_s_per_token = median(s[key] / s["tokens"] for s in measured_steps)
    # MFU with the FLOPs the simulator counts for the hf trainer (engine.train_layout: padded):
    # the update over padded micro-batches, the proximal forward over the padded step,
    # attention included (sim/costs.padded_training_time at MFU 1 is those FLOPs / peak).
    mfu = median(step_seconds_at_peak(model, peak, s) / s[key] for s in measured_steps)
    pick = min if clock == "cpu" else median
    ray_w = {k: pick(raw["weights_ray"][k]) for k in ("ping_s", "publish_s", "load_s")}
    load_bw = model.weight_bytes / ray_w["load_s"]
    ram_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    hardware = {"peak_bf16_tflops": peak / TERA, "hbm_gib": round(ram_gib, 1), "hbm_bandwidth_gbs": bandwidth / GB,
                "inference_bandwidth_efficiency": decode["bandwidth_efficiency"],
                "inference_compute_efficiency": decode["compute_efficiency"],
                "prefill_compute_efficiency": decode["prefill_efficiency"], "training_mfu": mfu,
                "intra_node_bandwidth_gbs": load_bw / GB, "inter_node_bandwidth_gbs": load_bw / GB,
                "devices_per_node": 1, "host_cores": raw["host_cores"]}
    hardware["corun_slowdown"], hardware["timeslice_slowdown"] = slowdowns(raw["corun"], raw["host_cores"])
    engine = {"decode_step_overhead_s": decode["overhead_s"], "call_overhead_s": decode["call_overhead_s"],
              "weight_sync_fixed_s": ray_w["publish_s"], "mode_switch_s": ray_w["ping_s"]}
    return {"clock": clock, "peak_flops": peak, "bandwidth": bandwidth, "decode": decode,
            "train_s_per_token": train_s_per_token, "ray": ray_w, "hardware": hardware, "engine": engine}


def profiles_of(fitted: dict):
    """The simulator's profiles from the fitted numbers (validated by profiles.*_from_config)."""
    from mindspeed_rl_asp.sim.profiles import engine_profile_from_config, hardware_profile_from_config

    hw, eng = fitted["hardware"], fitted["engine"]
    hardware = hardware_profile_from_config({"name": "cpu_local", **hw, "sources": {k: "fit" for k in hw}})
    engine_numbers = {"batching": "static", "execution": "serial", "max_num_seqs": 64, "gpu_memory_utilization": 0.5,
                      **eng}
    engine = engine_profile_from_config({"name": "hf", **engine_numbers, "sources": {k: "fit" for k in engine_numbers}})
    return hardware, engine


# ---------------------------------------------------------------------- report
def report(raw: dict, fitted: dict, model, command: str) -> str:
    from mindspeed_rl_asp.sim.batching import Instance, static_minibatch
    from mindspeed_rl_asp.sim.costs import padded_training_time
    from mindspeed_rl_asp.sim.profiles import GB

    clock = fitted["clock"]
    hardware, engine = profiles_of(fitted)
    inst = Instance(model, hardware, engine, 1, 10 ** 9)
    dec = fitted["decode"]
    rows = []
    for r in raw["generation"]:
        sim = static_minibatch(inst, r["prompt_tokens"], [r["decode_tokens"]] * r["batch"]).duration
        rows.append([r["shape"], r["batch"], r["padded_prompt"], r["decode_tokens"],
                     f"{1e3 * r['cpu_s']:.1f} / {1e3 * r['wall_s']:.1f}", f"{1e3 * sim:.1f}",
                     f"{100 * (sim / r[f'{clock}_s'] - 1):+.1f}%"])
    gen_table = table(["prompts x samples", "rows b", "padded prompt P", "tokens N", "ms, cpu / wall", "sim ms",
                       "error"], rows)
    key = f"{clock}_s"
    def step_price(step: dict) -> float:
        return padded_training_time(model, hardware, 1, step["prompt_lengths"], step["response_lengths"],
                                    STEP_MICRO_BATCH, 1)

    trows = [[s["step"], s["prompt_tokens"], s["response_tokens"], s["tokens"], f"{s['cpu_s']:.3f} / {s['wall_s']:.3f}",
              f"{1e3 * s[key] / s['tokens']:.3f}",
              f"{step_price(s):.3f}"]
             for s in raw["training"]["steps"]]
    train_table = table(["step", "prompt tokens", "response tokens", "trained tokens", "s, cpu / wall",
                         f"ms per trained token ({clock})", "sim s"], trows)
    p, bw, ip, rw = raw["peak"], raw["bandwidth"], raw["weights_in_process"], raw["weights_ray"]

    def ms(values):
        return f"median {1e3 * median(values):.2f} ms, min {1e3 * min(values):.2f} ms"

    machine_table = table(["quantity", "measured"], [
        ["float32 matmul 2048^3, 1 thread", f"{p['flop'] / p['cpu_s'] / 1e9:.1f} GFLOP/s cpu, "
                                            f"{p['flop'] / p['wall_s'] / 1e9:.1f} wall"],
        ["copy 256 MiB, 1 thread (read + write)", f"{bw['bytes'] / bw['cpu_s'] / 1e9:.2f} GB/s cpu, "
                                                 f"{bw['bytes'] / bw['wall_s'] / 1e9:.2f} wall"],
        ["generate call, fitted price (serial)", f"{1e3 * dec['coefficients']['call_s']:.2f} ms per call + "
                                                 f"{1e6 * dec['coefficients']['prefill_token_s']:.2f} us per prefill "
                                                 f"token + {1e3 * dec['coefficients']['step_s']:.3f} ms per step + "
                                                 f"{1e6 * dec['coefficients']['row_step_s']:.1f} us per row-step + "
                                                 f"{1e9 * dec['coefficients']['cached_token_step_s']:.1f} ns per "
                                                 f"cached token read ({clock})"],
        ["training per trained token (steps 1..)", f"{1e3 * fitted['train_s_per_token']:.3f} ms ({clock})"],
        ["export_weights / load_weights in process", f"{1e3 * ip['export_cpu_s']:.2f} / {1e3 * ip['load_cpu_s']:.2f}"
                                                     f" ms cpu, {1e3 * ip['export_wall_s']:.2f} / "
                                                     f"{1e3 * ip['load_wall_s']:.2f} ms wall"],
        ["Ray publish: export -> sealed", ms(rw["publish_s"])],
        ["Ray load: load_weights(version, ref) round trip", ms(rw["load_s"])],
        ["Ray no-op actor call", ms(rw["ping_s"])],
        ["1-min load average at start / end", f"{raw['load_average'][0]:.2f} / {raw['load_average'][1]:.2f}"],
    ])
    hw, eng = fitted["hardware"], fitted["engine"]
    fitted_table = table(["constant", "value", "from"], [
        ["hardware.peak_bf16_tflops", f"{hw['peak_bf16_tflops']:.5f}", f"float32 matmul rate ({clock}), the 'peak'"],
        ["hardware.hbm_gib", f"{hw['hbm_gib']}", "host memory"],
        ["hardware.hbm_bandwidth_gbs", f"{hw['hbm_bandwidth_gbs']:.2f}", f"copy bandwidth ({clock})"],
        ["hardware.inference_bandwidth_efficiency", f"{hw['inference_bandwidth_efficiency']:.4f}",
         f"generation fit: cached tokens read (effective "
         f"{hw['inference_bandwidth_efficiency'] * fitted['bandwidth'] / GB:.2f} GB/s)"],
        ["hardware.inference_compute_efficiency", f"{hw['inference_compute_efficiency']:.4f}",
         f"generation fit: per row-step (effective "
         f"{hw['inference_compute_efficiency'] * fitted['peak_flops'] / 1e9:.2f} GFLOP/s)"],
        ["hardware.prefill_compute_efficiency", f"{hw['prefill_compute_efficiency']:.4f}",
         f"generation fit: per prefill token (effective "
         f"{hw['prefill_compute_efficiency'] * fitted['peak_flops'] / 1e9:.2f} GFLOP/s)"],
        ["hardware.training_mfu", f"{hw['training_mfu']:.4f}",
         "padded training FLOPs (sim/costs.padded_training_time: update over padded micro-batches + proximal "
         "forward over the padded step, attention included) / time / peak, median over steps"],
        ["hardware.{intra,inter}_node_bandwidth_gbs", f"{hw['inter_node_bandwidth_gbs']:.3f}",
         f"{model.weight_bytes} weight bytes / Ray load {1e3 * fitted['ray']['load_s']:.2f} ms"],
        ["hardware.host_cores", f"{hw['host_cores']}", "cores this process may run on (sched_getaffinity)"],
        ["hardware.corun_slowdown", f"{hw['corun_slowdown']:.3f}",
         f"a {raw['corun']['rows']}-row generate call's CPU ms alone / beside k co-runners: "
         f"{1e3 * raw['corun']['alone_cpu_s']:.1f} / "
         + " / ".join(f"{1e3 * t:.1f} (k={k})" for k, t in raw["corun"]["beside_cpu_s"].items())],
        ["hardware.timeslice_slowdown", f"{hw['timeslice_slowdown']:.3f}", "the same calls, more threads than cores"],
        ["engine.decode_step_overhead_s", f"{eng['decode_step_overhead_s']:.5f}",
         f"generation fit: per step, less one weight read (RMS relative error {100 * dec['rms_relative_error']:.1f}%, "
         f"largest {100 * dec['max_relative_error']:.1f}%)"],
        ["engine.call_overhead_s", f"{eng['call_overhead_s']:.5f}", "generation fit: per call, less one weight read"],
        ["engine.weight_sync_fixed_s", f"{eng['weight_sync_fixed_s']:.5f}", "Ray publish round trip"],
        ["engine.mode_switch_s", f"{eng['mode_switch_s']:.5f}", "Ray no-op actor call round trip"],
    ])
    return "\n\n".join([
        f"Calibration {raw['date']} {raw['time']} (machine clock), `{command}`, {raw['seconds']:.0f} s of "
        f"measuring; {raw['machine']}; tiny policy {model.total_params} parameters ({model.weight_bytes} bytes), "
        f"1 torch thread; fitted on the {clock} clock.",
        "**Machine and engine**", machine_table,
        f"**Generation** (HFGenerationEngine.generate of k random task prompts x {SAMPLES} samples, left-padded, EOS "
        f"suppressed, every row N tokens; medians of {raw['reps']}; sim = sim/batching.static_minibatch with the "
        f"fitted profile; fit RMS relative error {100 * dec['rms_relative_error']:.1f}% over {dec['calls']} calls, "
        f"errors against the {clock} clock)",
        gen_table,
        "**Training** (TrainingWorker.train_step; step 0 is a warm-up)", train_table,
        "**Fitted constants**", fitted_table])


# ---------------------------------------------------------------------- yaml
def set_scalar(text: str, key: str, value: str, comment: str) -> str:
    pattern = re.compile(rf"^{re.escape(key)}:[^\n]*$", re.M)
    if not pattern.search(text):
        raise KeyError(f"{key} not found")
    line = f"{key}: {value}"
    line = f"{line:<32} # {comment}" if comment else line
    return pattern.sub(lambda _: line, text, count=1)


def set_source(text: str, key: str, source: str) -> str:
    """Replace ``sources.<key>`` (a one-line or a folded block value) with a folded block."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("sources:")), None)
    if start is None:
        raise KeyError("sources: not found")
    new = [f"  {key}: >-"] + _wrap(source, 100, "    ")
    i = start + 1
    while i < len(lines) and (lines[i].startswith("  ") or not lines[i].strip()):
        if re.match(rf"^  {re.escape(key)}:", lines[i]):
            j = i + 1
            while j < len(lines) and lines[j].startswith("    "):
                j += 1
            lines[i:j] = new
            return "\n".join(lines) + "\n"
        i += 1
    lines[i:i] = new
    return "\n".join(lines) + "\n"


def _wrap(text: str, width: int, indent: str) -> list[str]:
    out, line = [], ""
    for word in text.split():
        if line and len(indent) + len(line) + 1 + len(word) > width:
            out.append(indent + line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        out.append(indent + line)
    return out


def _num(value) -> str:
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}" if abs(value) >= 1e-3 else f"{value:.3e}"


def write_yaml(raw: dict, fitted: dict, model, command: str) -> None:
    hw, eng, dec, clock = fitted["hardware"], fitted["engine"], fitted["decode"], fitted["clock"]
    when = f"measured {raw['date']} by `{command}` on {raw['machine']}, 1 torch thread"
    clock_text = ("process CPU time (the machine was shared with other jobs; CPU time is the work's time on a core "
                  "of its own)" if clock == "cpu" else "wall clock")
    load = f"1-min load average {raw['load_average'][0]:.1f} at the start, {raw['load_average'][1]:.1f} at the end"
    gen = raw["generation"]
    coef = dec["coefficients"]
    decode_how = (f"{when}: {len(gen)} HFGenerationEngine.generate calls, each of k random task prompts (seed 0) x "
                  f"{SAMPLES} samples, left-padded as the runs batch them (k in {PROMPTS_PER_CALL}, two draws each, "
                  f"and one prompt alone), EOS suppressed (min_new_tokens = max_new_tokens) so every row decodes N "
                  f"in {DECODE_SERIES} tokens, {clock_text}, median of {raw['reps']}. The serial price of a call "
                  f"(sim/batching.static_minibatch with execution: serial) is linear in five coefficients, fitted "
                  f"(non-negative, squared relative error; RMS {100 * dec['rms_relative_error']:.1f}%, largest "
                  f"{100 * dec['max_relative_error']:.1f}% over the calls): {1e3 * coef['call_s']:.3f} ms per call, "
                  f"{1e6 * coef['prefill_token_s']:.3f} us per prefill token, {1e3 * coef['step_s']:.3f} ms per "
                  f"decode step, {1e6 * coef['row_step_s']:.3f} us per row-step, {1e9 * coef['cached_token_step_s']:.3f}"
                  f" ns per cached token per step; {load}")
    corun = raw["corun"]
    corun_how = (f"the CPU time of a generate call of {corun['rows']} rows (4 random task prompts x {SAMPLES}, "
                 f"{corun['tokens']} tokens each), median of {corun['reps']}, alone (before and after: "
                 f"{1e3 * corun['alone_cpu_s']:.1f} ms) and while k other processes made the same calls ("
                 + ", ".join(f"k={k}: {1e3 * t:.1f} ms" for k, t in corun["beside_cpu_s"].items()) + ")")
    ray_pick = "minimum (least disturbed)" if clock == "cpu" else "median"
    rw, ip = fitted["ray"], raw["weights_in_process"]
    training = raw["training"]["steps"]
    sources_hw = {
        "peak_bf16_tflops": f"{when}: float32 torch.mm of 2048 x 2048 matrices, 2 n^3 / t, {clock_text}, median of "
                            f"{raw['peak']['reps']} = {fitted['peak_flops'] / 1e9:.1f} GFLOP/s. Not a datasheet peak "
                            f"and not bf16: the tiny policy runs in float32, so the 'peak' is the rate one core "
                            f"reaches on a large float32 matmul; training_mfu and inference_compute_efficiency are "
                            f"shares of it; {load}",
        "hbm_gib": f"{when}: host memory (sysconf SC_PHYS_PAGES x SC_PAGE_SIZE)",
        "hbm_bandwidth_gbs": f"{when}: dst.copy_(src) of 256 MiB float32, (read + write bytes) / t, {clock_text}, "
                             f"median of {raw['bandwidth']['reps']}",
        "inference_bandwidth_efficiency": f"fitted (scripts/calibrate_cpu.py): kv bytes per token "
                                          f"({model.kv_bytes_per_token}) / (the cost per cached token per step x "
                                          f"hbm_bandwidth_gbs); {decode_how}",
        "inference_compute_efficiency": f"fitted (scripts/calibrate_cpu.py): 2 x {model.matmul_params} FLOP / (the "
                                        f"cost per row-step x peak_bf16_tflops); {decode_how}",
        "prefill_compute_efficiency": f"fitted (scripts/calibrate_cpu.py): 2 x {model.matmul_params} FLOP / (the "
                                      f"cost per prefill token x peak_bf16_tflops); {decode_how}",
        "host_cores": f"{when}: the cores this process may run on (os.sched_getaffinity); every process of a local "
                      f"run (its generation actors, trainer, driver) shares them",
        "corun_slowdown": f"{when}: {corun_how}; with every core busy (beside {raw['host_cores'] - 1}) a call "
                          f"costs 1 + corun_slowdown x (cores - 1) times its CPU time alone (cores share the "
                          f"host's last-level cache and memory bandwidth); {load}",
        "timeslice_slowdown": f"{when}: {corun_how}; beside {raw['host_cores']} (more threads than cores, time-sliced) "
                              f"a call costs (1 + timeslice_slowdown) times its every-core-busy CPU time (each switch "
                              f"refills the caches); {load}",
        "training_mfu": f"{when}: runtime/training_unit.TrainingWorker.train_step in process on {len(training) - 1} "
                        f"steps of 8 prompts x 4 samples sampled by the engine from the first task prompts (one more "
                        f"step as a warm-up): reward scoring, GRPO loss with TIS, the no-grad proximal forward and one "
                        f"AdamW update; {clock_text}, median {1e3 * fitted['train_s_per_token']:.3f} ms per trained "
                        f"token (prompt + response, unpadded); MFU = the step's FLOPs as the simulator counts them "
                        f"for the padded hf trainer (sim/costs.padded_training_time: the update's 3 passes over "
                        f"micro-batches of {STEP_MICRO_BATCH} rows padded to their longest prompt + response, one "
                        f"proximal forward over the whole step padded alike, 2 x {model.matmul_params} FLOP per "
                        f"token plus attention {model.attention_flops_coefficient} x L^2 per row) / its time / "
                        f"peak_bf16_tflops, median over the steps; {load}",
        "intra_node_bandwidth_gbs": f"{when}: {model.weight_bytes} weight bytes / the Ray load round trip "
                                    f"(GenerationWorker.load_weights(version, ref of a snapshot that "
                                    f"TrainingWorker.export_weights returned), {ray_pick} of "
                                    f"{raw['weights_ray']['reps']} = {1e3 * rw['load_s']:.2f} ms; load_weights alone "
                                    f"in process {1e3 * ip['load_cpu_s']:.2f} ms): the simulator's LoadWeights is "
                                    f"bytes / bandwidth",
        "inter_node_bandwidth_gbs": f"the same measurement as intra_node_bandwidth_gbs ({when}, "
                                    f"{1e3 * rw['load_s']:.2f} ms): the local layout's logical nodes share one host "
                                    f"and one Ray object store",
        "devices_per_node": "configs/layout/local.yaml (devices_per_node 1)",
    }
    sources_eng = {
        "decode_step_overhead_s": f"fitted (scripts/calibrate_cpu.py): the cost per decode step less one read of "
                                  f"the weights at the fitted bandwidth; {decode_how}",
        "call_overhead_s": f"fitted (scripts/calibrate_cpu.py): the cost per generate call less the prefill's read of "
                           f"the weights; {decode_how}",
        "weight_sync_fixed_s": f"{when}: the Ray publish round trip, TrainingWorker.export_weights.remote() until the "
                               f"object is sealed (ray.wait fetch_local=False, as runtime/ray_cluster publishes), "
                               f"{ray_pick} of {raw['weights_ray']['reps']} = {1e3 * rw['publish_s']:.2f} ms "
                               f"(export_weights alone in process {1e3 * ip['export_cpu_s']:.2f} ms)",
        "mode_switch_s": f"{when}: a no-op Ray actor call round trip (GenerationWorker.ready), {ray_pick} of "
                         f"{raw['weights_ray']['reps']}. On a CPU a colocated (hybrid) switch offloads nothing: the "
                         f"hand-over between the generate and the train phase is a Ray call",
    }
    comments = {"peak_bf16_tflops": "measured: float32 matmul, 1 thread (see sources)",
                "hbm_gib": "measured: host memory", "hbm_bandwidth_gbs": "measured: 1-thread copy",
                "inference_bandwidth_efficiency": "fitted to measured generate calls",
                "inference_compute_efficiency": "fitted to measured generate calls",
                "prefill_compute_efficiency": "fitted to measured generate calls",
                "host_cores": "measured: cores the run's processes share",
                "corun_slowdown": "measured: a core's slowdown beside a busy core",
                "timeslice_slowdown": "measured: the cost of more threads than cores",
                "training_mfu": "measured: TrainingWorker.train_step",
                "intra_node_bandwidth_gbs": "measured: Ray weight load",
                "inter_node_bandwidth_gbs": "measured: Ray weight load",
                "devices_per_node": "the local layout: one CPU \"device\" per logical node"}
    text = HARDWARE_YAML.read_text()
    for key, value in hw.items():
        text = set_scalar(text, key, _num(value), comments[key])
        text = set_source(text, key, sources_hw[key])
    text = re.sub(r"^# (PLACEHOLDERS|Calibrated by).*\n(#.*\n)*?(?=name:)", lambda _: (
        f"# Calibrated by scripts/calibrate_cpu.py on {raw['date']} (machine clock); every number's source says\n"
        "# what was measured and how. On another machine: `python scripts/calibrate_cpu.py --write`.\n"),
        text, count=1, flags=re.M)
    HARDWARE_YAML.write_text(text)
    text = ENGINE_YAML.read_text()
    comments = {"decode_step_overhead_s": "fitted to measured generate calls",
                "call_overhead_s": "fitted to measured generate calls",
                "weight_sync_fixed_s": "measured: Ray publish round trip",
                "mode_switch_s": "measured: Ray no-op call (nothing to offload on CPU)"}
    for key, value in eng.items():
        text = set_scalar(text, key, _num(value), comments[key])
        text = set_source(text, key, sources_eng[key])
    ENGINE_YAML.write_text(text)
    # Both files must still build valid profiles.
    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.sim.profiles import engine_profile_from_config, hardware_profile_from_config

    cfg = load_config(["hardware=cpu_local", "engine=hf"])
    hardware_profile_from_config(cfg.hardware)
    engine_profile_from_config(cfg.engine)


# ---------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true",
                    help="update configs/hardware/cpu_local.yaml and configs/engine/hf.yaml")
    ap.add_argument("--quick", action="store_true", help="fewer repeats (development)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="fit CPU times (default; right on a shared machine) or wall times")
    ap.add_argument("--nice", type=int, default=0, help="raise this process's niceness (and its Ray workers') first")
    ap.add_argument("--json", type=Path, default=REPO / "runs" / "calibrate_cpu.json",
                    help="where the raw measurements are saved (default runs/calibrate_cpu.json)")
    ap.add_argument("--refit", type=Path, default=None, help="fit saved measurements instead of measuring")
    ap.add_argument("--composition-check", type=int, default=0, metavar="K",
                    help="only measure the decode step of the first K real minibatches (4 prompts x 4, padded) "
                         "against 16 copies of their longest prompt, print, and exit (nothing is fitted or written)")
    args = ap.parse_args(argv)
    if args.nice:
        os.nice(args.nice)

    import torch

    torch.set_num_threads(1)
    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.config.validate import resolve_model_path
    from mindspeed_rl_asp.sim.profiles import model_profile_from_config

    cfg = load_config([f"task.num_prompts={TRAIN_PROMPTS}", "engine.num_threads=1", "hardware=cpu_local"])
    model = model_profile_from_config(cfg.model)
    if args.composition_check:
        load = os.getloadavg()[0]
        rows = composition_check(cfg, str(resolve_model_path(cfg.model.path)), args.composition_check,
                                 2 if args.quick else 3)
        print(f"Composition check {time.strftime('%Y-%m-%d %H:%M')} (machine clock), `python scripts/calibrate_cpu.py "
              f"--composition-check {args.composition_check}`, CPU time, 1-min load average {load:.1f} -> "
              f"{os.getloadavg()[0]:.1f}\n")
        print(table(["prompts (tokens)", "decode step ms, 4 prompts x 4 (padded)", "16 x the longest", "ratio"],
                    [[r["prompt_tokens"], f"{1e3 * r['mixed_step_cpu_s']:.2f}", f"{1e3 * r['same_step_cpu_s']:.2f}",
                      f"{r['mixed_step_cpu_s'] / r['same_step_cpu_s']:.2f}"] for r in rows]))
        return 0
    if args.refit:
        raw = json.loads(args.refit.read_text())
        command = f"{raw['command']}`, fitted by `python scripts/calibrate_cpu.py --refit {args.refit.name}"
    else:
        command = "python scripts/calibrate_cpu.py" + " --quick" * args.quick + (
            f" --nice {args.nice}" if args.nice else "")
        raw = measure(args, cfg, str(resolve_model_path(cfg.model.path)))
        raw["command"] = command
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(raw, indent=2) + "\n")
        log(f"raw measurements saved to {args.json}")
    if args.clock != "cpu":
        command += f" --clock {args.clock}"
    if args.write:
        command += " --write"
    fitted = fit(raw, model, args.clock)
    print(report(raw, fitted, model, command))
    if args.write:
        write_yaml(raw, fitted, model, command)
        log(f"wrote {HARDWARE_YAML.relative_to(REPO)} and {ENGINE_YAML.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
