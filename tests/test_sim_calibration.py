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
    model = model_profile_from_config(load_config([]).model)
    peak, bandwidth = 80e9, 10e9
    hardware = HardwareProfile("t", peak, 24 * 2**30, bandwidth, 0.2, 0.3, 0.25, 1e9, 1e9, 1)
    engine = EngineProfile("hf", "static", 0.004, 64, 0.5, 0.01, 0.001)
    inst = Instance(model, hardware, engine, 1, 10**9)
    rows = []
    for P, batches in ((56, (1, 2, 4, 8, 16, 32, 64)), (204, (1, 4, 16, 64))):
        for b in batches:
            first = static_minibatch(inst, [P] * b, [1] * b).duration
            full = static_minibatch(inst, [P] * b, [65] * b).duration
            rows.append({"batch": b, "prompt_tokens": P, "decode_tokens": 65, "first_cpu_s": first,
                         "full_cpu_s": full, "step_cpu_s": (full - first) / 64})
    fit = calibrate.fit_generation(model, rows, "cpu", peak, bandwidth)
    assert fit["overhead_s"] == pytest.approx(0.004, rel=0.05)
    assert fit["bandwidth_efficiency"] == pytest.approx(0.2, rel=0.05)
    assert fit["compute_efficiency"] == pytest.approx(0.3, rel=0.05)
    assert fit["rms_relative_error"] < 0.02


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
                "inference_compute_efficiency", "training_mfu", "intra_node_bandwidth_gbs",
                "inter_node_bandwidth_gbs"):
        assert "placeholder" not in hardware.sources[key].lower()
        assert "calibrate_cpu.py" in hardware.sources[key]
    for key in ("decode_step_overhead_s", "weight_sync_fixed_s", "mode_switch_s"):
        assert "calibrate_cpu.py" in engine.sources[key]
    text = (ROOT / "configs" / "hardware" / "cpu_local.yaml").read_text()
    assert "placeholder" not in text.lower()
