"""Calibrate the simulator's cpu_local profile and the hf engine profile on this machine.

Profiles the machine with the project's own hf engine and the shipped tiny maze policy
(``mindspeed_rl_asp/assets/tiny-maze-qwen3``, one torch thread as the runs use), fits the
simulator's constants from the measurements, prints both, and with ``--write`` writes
them into ``configs/hardware/cpu_local.yaml`` and the measured entries of
``configs/engine/hf.yaml`` with a ``sources`` text that says what was measured, how,
when and with which command::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/calibrate_cpu.py            # measure, fit, print (~3 min idle)
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
3. **Generation** (``HFGenerationEngine.generate``, the engine the runs use): one maze
   prompt of the median (and, second series, the longest) token length among the
   benchmark's 320 task prompts, repeated ``b`` times, for ``b`` in 1..64, with the
   end-of-text token suppressed (``min_new_tokens = max_new_tokens = N``, a
   ``GenerationConfig`` wrapper around the engine's own call) so that every row decodes
   exactly ``N`` tokens. Decode step time = ``(T(N=65) - T(N=1)) / 64``; the call with
   ``N=1`` is the prefill plus the call's fixed cost, regressed on the ``b x P`` prompt
   tokens.
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

What is fitted: the simulator prices a static-batch generate call
(``sim/batching.static_minibatch``) as a prefill of ``b x P`` tokens, ``max(2 x matmul params
x b P / (peak x eff_c), weights / (bw x eff_bw))``, then ``N - 1`` decode steps of ``overhead
+ max(memory, compute)`` (``sim/costs.decode_step_time``) with ``memory = (weights + kv
tokens x kv bytes) / (bw x eff_bw)``, the cache growing from ``b (P + 1)`` by ``b`` a step,
and ``compute = 2 x matmul params x b / (peak x eff_c)``. ``overhead``, ``eff_bw`` and
``eff_c`` minimise the squared relative error of that price over every measured call
(``N = 1`` and ``N = 65``; grid over the two efficiencies, weighted least squares for the
overhead); the report re-prices every call with the simulator's own functions. ``training_mfu = 8 x matmul params x
tokens / (t x peak)`` (update 6 + proximal forward 2, ``sim/costs.training_time``). Weight
sync: the Ray publish round trip is ``engine.weight_sync_fixed_s`` (the simulator's
Publish), the weight bytes over the Ray load round trip the node bandwidths (the
simulator's LoadWeights is ``bytes / bandwidth``; on one host the colocated and the
"inter-node" path are the same Ray object store), the no-op round trip the hybrid
hand-over ``engine.mode_switch_s`` (nothing is offloaded on a CPU).

The simulator has one compute efficiency for prefill and decode matmuls, so fitting whole
calls puts the error where the runs spend the least time: a maze minibatch is a long
prompt (56 to 204 tokens) and a short answer (tens of tokens).
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
BATCHES = (1, 2, 4, 8, 16, 32, 64)
LONG_BATCHES = (1, 4, 16, 64)
DECODE_TOKENS = 65
TRAIN_PROMPTS = 320           # the benchmark's task.num_prompts
STEP_PROMPTS, SAMPLES = 8, 4  # rl.global_batch_size x rl.n_samples_per_prompt of the runs
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


def measure_generation(engine, series: dict[str, list[int]], batches: dict[str, tuple[int, ...]], reps: int,
                       tokens: int) -> list[dict]:
    """Per (series, b): medians of the N=1 and N=``tokens`` calls, wall and CPU."""
    from tqdm import tqdm

    from mindspeed_rl_asp.engines.base import SamplingParams

    jobs = [(name, b) for name in series for b in batches[name]]
    bar = tqdm(total=len(jobs) * reps * 2, desc="generate", unit="call", file=sys.stderr)
    rows = []
    with ForcedLength():
        engine.generate([series[next(iter(series))]], SamplingParams(max_tokens=8, seed=0))  # warm-up
        for name, b in jobs:
            ids = series[name]
            runs = {1: [], tokens: []}
            for r in range(reps):
                for n in (1, tokens):
                    w, c, out = timed(engine.generate, [ids] * b, SamplingParams(max_tokens=n, seed=r))
                    if any(length != n for length in out.response_lengths):
                        raise RuntimeError(f"forced length failed: asked {n}, got {set(out.response_lengths)}")
                    runs[n].append((w, c))
                    bar.update(1)
            row = {"series": name, "batch": b, "prompt_tokens": len(ids), "prefill_tokens": b * len(ids),
                   "decode_tokens": tokens}
            for clock, k in (("wall", 0), ("cpu", 1)):
                first, full = median(x[k] for x in runs[1]), median(x[k] for x in runs[tokens])
                row[f"first_{clock}_s"], row[f"full_{clock}_s"] = first, full
                row[f"step_{clock}_s"] = (full - first) / (tokens - 1)
            rows.append(row)
            bar.set_postfix(series=name, b=b, step_ms=f"{1e3 * row['step_cpu_s']:.2f}")
    bar.close()
    return rows


# ---------------------------------------------------------------------- training
def measure_training(cfg, model_path: str, steps: int) -> tuple[dict, object, object]:
    """Real ``TrainingWorker.train_step`` on sampled steps; returns (measurements, worker, engine)."""
    import numpy as np
    from omegaconf import OmegaConf

    from mindspeed_rl_asp.engines.base import SamplingParams
    from mindspeed_rl_asp.engines.hf import HFGenerationEngine
    from mindspeed_rl_asp.runtime.generation_unit import SampleGroup
    from mindspeed_rl_asp.runtime.training_unit import TrainingWorker
    from mindspeed_rl_asp.tasks import make_task_prompts

    prompts = make_task_prompts(cfg.task)
    engine = HFGenerationEngine(model_path, num_threads=1)
    tok = engine.tokenizer
    worker = TrainingWorker(OmegaConf.to_container(cfg.engine), model_path, OmegaConf.to_container(cfg.train),
                            OmegaConf.to_container(cfg.rl), OmegaConf.to_container(cfg.algo),
                            OmegaConf.to_container(cfg.task), cfg.generate.sampling_config.temperature)
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
        wall, cpu, report = timed(worker.train_step, step, [p.id for p in chunk], payload)
        rows.append({"step": step, "prompt_tokens": prompt_tokens, "response_tokens": response_tokens,
                     "tokens": prompt_tokens + response_tokens, "wall_s": wall, "cpu_s": cpu})
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
    from omegaconf import OmegaConf

    from mindspeed_rl_asp.runtime.generation_unit import GenerationWorker
    from mindspeed_rl_asp.runtime.training_unit import TrainingWorker

    # The actors' environment as runtime/driver._ray_options sets it.
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}
    opts = {"num_cpus": 1, "max_concurrency": 1, "runtime_env": {"env_vars": env}}
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        engine_cfg = OmegaConf.to_container(cfg.engine)
        gen = ray.remote(GenerationWorker).options(**opts).remote(
            0, engine_cfg, model_path, OmegaConf.to_container(cfg.generate.sampling_config),
            cfg.rl.n_samples_per_prompt)
        trainer = ray.remote(TrainingWorker).options(**opts).remote(
            engine_cfg, model_path, OmegaConf.to_container(cfg.train), OmegaConf.to_container(cfg.rl),
            OmegaConf.to_container(cfg.algo), OmegaConf.to_container(cfg.task),
            cfg.generate.sampling_config.temperature)
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
    lengths = sorted((len(engine.tokenizer(p.prompt, add_special_tokens=False)["input_ids"]), p.id, p.prompt)
                     for p in make_task_prompts(cfg.task))
    med, longest = lengths[len(lengths) // 2], lengths[-1]
    series = {"median prompt": engine.tokenizer(med[2], add_special_tokens=False)["input_ids"],
              "longest prompt": engine.tokenizer(longest[2], add_special_tokens=False)["input_ids"]}
    batches = {"median prompt": BATCHES, "longest prompt": LONG_BATCHES}
    log(f"generation: prompts of {med[0]} (median of {len(lengths)}) and {longest[0]} (longest) tokens, "
        f"batches {BATCHES} / {LONG_BATCHES}, N = 1 and {DECODE_TOKENS} tokens, {reps} repeats")
    generation = measure_generation(engine, series, batches, reps, DECODE_TOKENS)
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
            "quick": args.quick, "reps": reps, "load_average": [load_start, os.getloadavg()[0]],
            "seconds": time.perf_counter() - started, "peak": peak, "bandwidth": bw, "generation": generation,
            "training": training, "weights_in_process": in_process, "weights_ray": ray_w}


# ---------------------------------------------------------------------- fit
def fit_generation(model, rows: list[dict], clock: str, peak: float, bandwidth: float) -> dict:
    """Overhead, bandwidth and compute efficiency with which the simulator's price of a
    static-batch generate call (``sim/batching.static_minibatch``: prefill of ``b x P``
    tokens, then ``N - 1`` decode steps of ``b`` rows, the cache growing by ``b`` a step)
    best fits every measured call, ``N = 1`` and ``N = 65`` alike (squared relative error).

    The sim prices prefill and decode matmuls with the same compute efficiency, so fitting
    whole calls makes the constants right where the runs spend their time: a maze
    minibatch is a long prompt (56 to 204 tokens) and a short answer (tens of tokens)."""
    import numpy as np

    W, kvb, mp = model.dense_weight_bytes, model.kv_bytes_per_token, model.matmul_params
    calls = [(r, 1, r[f"first_{clock}_s"]) for r in rows] + [(r, r["decode_tokens"], r[f"full_{clock}_s"])
                                                               for r in rows]
    y = np.array([t for _, _, t in calls])
    b = np.array([r["batch"] for r, _, _ in calls], dtype=float)
    P = np.array([r["prompt_tokens"] for r, _, _ in calls], dtype=float)
    steps = np.array([n - 1 for _, n, _ in calls], dtype=float)
    jmax = int(steps.max())
    j = np.arange(jmax, dtype=float)
    live = j[None, :] < steps[:, None]                      # which decode steps each call has
    kv = b[:, None] * (P[:, None] + 1.0 + j[None, :])       # cache at step j (sim/batching.static_minibatch)
    w = 1.0 / y ** 2
    best = None
    for e_bw in np.geomspace(1e-3, 1.0, 241):
        mem = (W + kv * kvb) / (bandwidth * e_bw)
        pre_mem = W / (bandwidth * e_bw)
        for e_c in np.geomspace(1e-4, 1.0, 321):
            comp = 2.0 * mp * b / (peak * e_c)
            decode = np.where(live, np.maximum(mem, comp[:, None]), 0.0).sum(axis=1)
            prefill = np.maximum(2.0 * mp * b * P / (peak * e_c), pre_mem)
            g = prefill + decode
            c0 = float(np.sum(w * steps * (y - g)) / np.sum(w * steps ** 2))
            if c0 <= 0:
                continue
            err = float(np.sum(w * (y - g - c0 * steps) ** 2))
            if best is None or err < best[0]:
                best = (err, float(e_bw), float(e_c), c0)
    if best is None:
        raise RuntimeError("no positive decode overhead fits the measurements")
    err, e_bw, e_c, c0 = best
    step = np.array([r[f"step_{clock}_s"] for r in rows])
    slope, intercept = np.polyfit(np.array([r["batch"] for r in rows], dtype=float), step, 1)
    return {"overhead_s": c0, "bandwidth_efficiency": e_bw, "compute_efficiency": e_c,
            "rms_relative_error": math.sqrt(err / len(y)), "calls": len(y), "linear_intercept_s": float(intercept),
            "linear_slope_s_per_row": float(slope)}


def fit_prefill(rows: list[dict], clock: str) -> dict:
    import numpy as np

    x = np.array([r["prefill_tokens"] for r in rows], dtype=float)
    y = np.array([r[f"first_{clock}_s"] for r in rows])
    slope, intercept = np.polyfit(x, y, 1)
    return {"s_per_token": float(slope), "call_fixed_s": float(intercept)}


def fit(raw: dict, model, clock: str) -> dict:
    from mindspeed_rl_asp.sim.profiles import GB, GIB, TERA

    key = f"{clock}_s"
    peak = raw["peak"]["flop"] / raw["peak"][key]
    bandwidth = raw["bandwidth"]["bytes"] / raw["bandwidth"][key]
    decode = fit_generation(model, raw["generation"], clock, peak, bandwidth)
    prefill = fit_prefill(raw["generation"], clock)
    measured_steps = raw["training"]["steps"][1:]
    train_s_per_token = median(s[key] / s["tokens"] for s in measured_steps)
    mfu = 8.0 * model.matmul_params / (train_s_per_token * peak)
    pick = min if clock == "cpu" else median
    ray_w = {k: pick(raw["weights_ray"][k]) for k in ("ping_s", "publish_s", "load_s")}
    load_bw = model.weight_bytes / ray_w["load_s"]
    ram_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    hardware = {"peak_bf16_tflops": peak / TERA, "hbm_gib": round(ram_gib, 1), "hbm_bandwidth_gbs": bandwidth / GB,
                "inference_bandwidth_efficiency": decode["bandwidth_efficiency"],
                "inference_compute_efficiency": decode["compute_efficiency"], "training_mfu": mfu,
                "intra_node_bandwidth_gbs": load_bw / GB, "inter_node_bandwidth_gbs": load_bw / GB,
                "devices_per_node": 1}
    engine = {"decode_step_overhead_s": decode["overhead_s"], "weight_sync_fixed_s": ray_w["publish_s"],
              "mode_switch_s": ray_w["ping_s"]}
    return {"clock": clock, "peak_flops": peak, "bandwidth": bandwidth, "decode": decode, "prefill": prefill,
            "train_s_per_token": train_s_per_token, "ray": ray_w, "hardware": hardware, "engine": engine}


def profiles_of(fitted: dict):
    """The simulator's profiles from the fitted numbers (validated by profiles.*_from_config)."""
    from mindspeed_rl_asp.sim.profiles import engine_profile_from_config, hardware_profile_from_config

    hw, eng = fitted["hardware"], fitted["engine"]
    hardware = hardware_profile_from_config({"name": "cpu_local", **hw, "sources": {k: "fit" for k in hw}})
    engine_numbers = {"batching": "static", "execution": "fitted", "max_num_seqs": 64, "gpu_memory_utilization": 0.5,
                      **eng}
    engine = engine_profile_from_config({"name": "hf", **engine_numbers, "sources": {k: "fit" for k in engine_numbers}})
    return hardware, engine


# ---------------------------------------------------------------------- report
def report(raw: dict, fitted: dict, model, command: str) -> str:
    from mindspeed_rl_asp.sim.batching import Instance, decode_steps_time, static_minibatch
    from mindspeed_rl_asp.sim.costs import training_time
    from mindspeed_rl_asp.sim.profiles import GB

    clock = fitted["clock"]
    hardware, engine = profiles_of(fitted)
    inst = Instance(model, hardware, engine, 1, 10 ** 9)
    dec, pre = fitted["decode"], fitted["prefill"]
    rows = []
    for r in raw["generation"]:
        b, P, N = r["batch"], r["prompt_tokens"], r["decode_tokens"]
        sim_first = static_minibatch(inst, [P] * b, [1] * b).duration
        sim_full = static_minibatch(inst, [P] * b, [N] * b).duration
        sim_step = decode_steps_time(inst, b, N - 1, b * (P + 1), b) / (N - 1)
        first, full, step = r[f"first_{clock}_s"], r[f"full_{clock}_s"], r[f"step_{clock}_s"]
        rows.append([r["series"], b, P,
                     f"{1e3 * r['first_cpu_s']:.1f} / {1e3 * r['first_wall_s']:.1f}", f"{1e3 * sim_first:.1f}",
                     f"{100 * (sim_first / first - 1):+.0f}%",
                     f"{1e3 * r['full_cpu_s']:.0f} / {1e3 * r['full_wall_s']:.0f}", f"{1e3 * sim_full:.0f}",
                     f"{100 * (sim_full / full - 1):+.0f}%",
                     f"{1e3 * r['step_cpu_s']:.2f} / {1e3 * r['step_wall_s']:.2f}", f"{1e3 * sim_step:.2f}"])
    gen_table = table(["series", "batch b", "prompt P", "T(N=1) ms, cpu / wall", "sim ms", "error",
                       f"T(N={DECODE_TOKENS}) ms, cpu / wall", "sim ms", "error",
                       "decode step ms, cpu / wall", "sim step ms"], rows)
    key = f"{clock}_s"
    trows = [[s["step"], s["prompt_tokens"], s["response_tokens"], s["tokens"], f"{s['cpu_s']:.3f} / {s['wall_s']:.3f}",
              f"{1e3 * s[key] / s['tokens']:.3f}", f"{training_time(model, hardware, 1, s['tokens'], 1):.3f}"]
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
        ["prefill per prompt token (slope of T(N=1) over b x P)",
         f"{1e6 * pre['s_per_token']:.2f} us; call fixed {1e3 * pre['call_fixed_s']:.1f} ms ({clock})"],
        ["decode step, least squares a + s b", f"a = {1e3 * dec['linear_intercept_s']:.2f} ms, "
                                               f"s = {1e3 * dec['linear_slope_s_per_row']:.3f} ms per row ({clock})"],
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
         f"generation fit (effective {hw['inference_bandwidth_efficiency'] * fitted['bandwidth'] / GB:.2f} GB/s)"],
        ["hardware.inference_compute_efficiency", f"{hw['inference_compute_efficiency']:.4f}",
         f"generation fit (effective {hw['inference_compute_efficiency'] * fitted['peak_flops'] / 1e9:.2f} GFLOP/s)"],
        ["hardware.training_mfu", f"{hw['training_mfu']:.4f}",
         f"8 x {model.matmul_params} FLOP per token / {1e3 * fitted['train_s_per_token']:.3f} ms / peak"],
        ["hardware.{intra,inter}_node_bandwidth_gbs", f"{hw['inter_node_bandwidth_gbs']:.3f}",
         f"{model.weight_bytes} weight bytes / Ray load {1e3 * fitted['ray']['load_s']:.2f} ms"],
        ["engine.decode_step_overhead_s", f"{eng['decode_step_overhead_s']:.5f}",
         f"generation fit (RMS relative error {100 * dec['rms_relative_error']:.1f}%)"],
        ["engine.weight_sync_fixed_s", f"{eng['weight_sync_fixed_s']:.5f}", "Ray publish round trip"],
        ["engine.mode_switch_s", f"{eng['mode_switch_s']:.5f}", "Ray no-op actor call round trip"],
    ])
    return "\n\n".join([
        f"Calibration {raw['date']} {raw['time']} (machine clock), `{command}`, {raw['seconds']:.0f} s of "
        f"measuring; {raw['machine']}; tiny policy {model.total_params} parameters ({model.weight_bytes} bytes), "
        f"1 torch thread; fitted on the {clock} clock.",
        "**Machine and engine**", machine_table,
        f"**Generation** (HFGenerationEngine.generate, EOS suppressed, every row N tokens; medians of {raw['reps']}; "
        f"sim = sim/batching.static_minibatch with the fitted profile; fit RMS relative error "
        f"{100 * dec['rms_relative_error']:.1f}% over {dec['calls']} calls, errors against the {clock} clock)",
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
    calls = ", ".join(f"b={g['batch']}/P={g['prompt_tokens']}: {1e3 * g[f'first_{clock}_s']:.1f} / "
                      f"{1e3 * g[f'full_{clock}_s']:.0f} ms" for g in gen)
    decode_how = (f"{when}: HFGenerationEngine.generate of one maze prompt repeated b times (the median, "
                  f"{gen[0]['prompt_tokens']} tokens, and the longest of the 320 task prompts of seed 0), EOS "
                  f"suppressed (min_new_tokens = max_new_tokens) so every row decodes N tokens, {clock_text}, "
                  f"median of {raw['reps']}, T(N=1) / T(N={DECODE_TOKENS}): {calls}. The three generation "
                  f"constants (hardware inference_bandwidth_efficiency and inference_compute_efficiency, "
                  f"engine.decode_step_overhead_s) are the least-squares fit (relative error, RMS "
                  f"{100 * dec['rms_relative_error']:.1f}% over the {dec['calls']} calls) of the simulator's price "
                  f"of those calls (sim/batching.static_minibatch: prefill, then N - 1 decode steps of overhead + "
                  f"max(memory, compute)); {load}")
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
        "inference_bandwidth_efficiency": f"fitted (scripts/calibrate_cpu.py): share of hbm_bandwidth_gbs the "
                                          f"memory term (weights + KV cache per step) runs at; {decode_how}",
        "inference_compute_efficiency": f"fitted (scripts/calibrate_cpu.py): share of peak_bf16_tflops the compute "
                                        f"term (2 x {model.matmul_params} FLOP per token, prefill and decode) runs at; "
                                        f"{decode_how}",
        "training_mfu": f"{when}: runtime/training_unit.TrainingWorker.train_step in process on {len(training) - 1} "
                        f"steps of 8 prompts x 4 samples sampled by the engine from the first task prompts (one more "
                        f"step as a warm-up): reward scoring, GRPO loss with TIS, the no-grad proximal forward and one "
                        f"AdamW update; {clock_text}, median {1e3 * fitted['train_s_per_token']:.3f} ms per trained "
                        f"token (prompt + response, unpadded, as the simulator counts them); MFU = 8 x "
                        f"{model.matmul_params} FLOP per token / that time / peak_bf16_tflops; {load}",
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
        "decode_step_overhead_s": f"fitted (scripts/calibrate_cpu.py): the per-step cost outside the roofline; "
                                  f"{decode_how}",
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
