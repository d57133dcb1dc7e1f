"""The calibration script's fit and yaml editing, and the calibrated cpu_local profile:
the generation fit recovers known constants from calls priced by the simulator itself,
yaml edits replace one value and one source (one-line or folded) and nothing else, and
the shipped profiles carry a measured source for every number (no placeholder left)."""
import importlib.util
from pathlib import Path

import pytest

from mindspeed_rl_asp.config.load import load_config
from mindspeed_rl_asp.sim.batching import Instance, static_minibatch
from mindspeed_rl_asp.sim.profiles import (
    EngineProfile, HardwareProfile, engine_profile_from_config, hardware_profile_from_config,
    model_profile_from_config,
)

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


calibrate = _script("calibrate_cpu")


def test_generation_fit_recovers_the_constants_that_priced_the_calls():
    """Calls of the calibration's own shapes, priced by the simulator's serial model
    from known constants: the fit reads the same constants back."""
    import random

    model = model_profile_from_config(load_config([]).model)
    peak, bandwidth = 80e9, 10e9
    hardware = HardwareProfile("t", peak, 24 * 2**30, bandwidth, 0.2, 0.3, 0.25, 1e9, 1e9, 1,
                               prefill_compute_efficiency=0.45, host_cores=2)
    engine = EngineProfile("hf", "static", 0.004, 64, 0.5, 0.01, 0.001, execution="serial", call_overhead=0.002)
    inst = Instance(model, hardware, engine, 1, 10**9)
    rng = random.Random(1)
    prompts = [[0] * rng.randint(56, 204) for _ in range(320)]
    rows = []
    for name, batch in calibrate.minibatch_shapes(prompts):
        lengths = [len(ids) for ids in batch]
        for n in calibrate.DECODE_SERIES:
            t = static_minibatch(inst, lengths, [n] * len(batch)).duration
            rows.append({"shape": name, "batch": len(batch), "prompt_tokens": lengths, "padded_prompt": max(lengths),
                         "decode_tokens": n, "cpu_s": t, "wall_s": t})
    fit = calibrate.fit_generation(model, rows, "cpu", peak, bandwidth)
    assert fit["overhead_s"] == pytest.approx(0.004, rel=1e-6)
    assert fit["call_overhead_s"] == pytest.approx(0.002, rel=1e-6)
    assert fit["bandwidth_efficiency"] == pytest.approx(0.2, rel=1e-6)
    assert fit["compute_efficiency"] == pytest.approx(0.3, rel=1e-6)
    assert fit["prefill_efficiency"] == pytest.approx(0.45, rel=1e-6)
    assert fit["max_relative_error"] < 1e-9


def test_the_fit_never_reads_a_rate_above_the_machine():
    """Noise that would make a row-step cheaper than its FLOPs at the peak is held at the
    peak (efficiency 1), never above it."""
    model = model_profile_from_config(load_config([]).model)
    peak, bandwidth = 80e9, 10e9
    rows = []
    for b, P, n in ((4, 60, 1), (4, 60, 65), (16, 200, 1), (16, 200, 65), (64, 120, 17), (64, 120, 65), (8, 90, 17)):
        steps = n - 1
        # Costs that grow with the cache only: no per-row cost at all.
        t = 0.003 + 40e-6 * b * P + 0.001 * steps + 2e-7 * b * (steps * (P + 1) + steps * (steps - 1) / 2)
        rows.append({"batch": b, "padded_prompt": P, "decode_tokens": n, "cpu_s": t})
    fit = calibrate.fit_generation(model, rows, "cpu", peak, bandwidth)
    assert fit["compute_efficiency"] == pytest.approx(1.0)
    assert 0 < fit["bandwidth_efficiency"] <= 1 and 0 < fit["prefill_efficiency"] <= 1


def test_slowdowns_read_back_the_factors_that_made_the_times():
    t0, s, sigma = 0.1, 0.05, 0.2
    corun = {"alone_cpu_s": t0, "beside_cpu_s": {"1": t0 * (1 + s), "2": t0 * (1 + s) * (1 + sigma)}}
    assert calibrate.slowdowns(corun, 2) == pytest.approx((s, sigma))
    faster = {"alone_cpu_s": t0, "beside_cpu_s": {"1": 0.9 * t0, "2": 0.95 * t0}}   # noise: never below zero
    assert calibrate.slowdowns(faster, 2) == (0.0, pytest.approx(0.0))


YAML = """name: x
peak: 1.0   # stale
other: 2
sources:
  peak: stale one-line source
  folded: >-
    stale folded
    source
  other: keep me
"""


def test_yaml_edits_replace_one_value_and_one_source():
    text = calibrate.set_scalar(YAML, "peak", "3.5", "measured")
    assert "peak: 3.5" in text and "# measured" in text and "other: 2" in text
    text = calibrate.set_source(text, "peak", "new source")
    text = calibrate.set_source(text, "folded", "new folded")
    assert "stale" not in text
    assert "  peak: >-\n    new source\n" in text and "  folded: >-\n    new folded\n" in text
    assert "  other: keep me" in text
    text = calibrate.set_source(text, "added", "a new key")
    assert text.rstrip().endswith("  added: >-\n    a new key")


def test_shipped_cpu_local_and_hf_profiles_are_calibrated():
    cfg = load_config(["hardware=cpu_local", "engine=hf"])
    hardware = hardware_profile_from_config(cfg.hardware)
    engine = engine_profile_from_config(cfg.engine)
    for key in ("peak_bf16_tflops", "hbm_bandwidth_gbs", "inference_bandwidth_efficiency",
                "inference_compute_efficiency", "prefill_compute_efficiency", "training_mfu",
                "intra_node_bandwidth_gbs", "inter_node_bandwidth_gbs", "host_cores", "corun_slowdown",
                "timeslice_slowdown"):
        assert "placeholder" not in hardware.sources[key].lower()
        assert "calibrate_cpu.py" in hardware.sources[key]
    for key in ("decode_step_overhead_s", "call_overhead_s", "weight_sync_fixed_s", "mode_switch_s"):
        assert "calibrate_cpu.py" in engine.sources[key]
    assert engine.execution == "serial" and engine.call_overhead > 0
    assert hardware.host_cores >= 1 and 0 < hardware.prefill_compute_efficiency <= 1
    text = (ROOT / "configs" / "hardware" / "cpu_local.yaml").read_text()
    assert "placeholder" not in text.lower()
