"""The ``hf`` engine: transformers + torch. The CPU default; also GPU (``cuda``) and
Ascend NPU (``npu``, through torch_npu, imported only when asked for).

Sampling and training log-probs agree by construction: both lay a batch out the same
way (prompts left-padded, responses right-padded, positions counted from the first real
token) and both read ``log_softmax(logits / temperature)``; sampling disables HF's
default top-k (50), which would otherwise make the sampler's distribution differ from
the one the trainer evaluates.

Sampling keeps the log-prob of the sampled token only: a logits processor placed last in
the chain holds one step's log-softmax and reads the sampled token off the next step's
input, so memory is [batch, vocab], never [batch, steps, vocab] (``output_scores``).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from .base import EngineError, GenerationOutput, LossFn, SamplingParams, TrainBatch, WeightSnapshot

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16"}


def _torch_dtype(name: str):
    import torch

    if name not in _DTYPES:
        raise EngineError(f"engine.dtype={name!r} is not one of {', '.join(sorted(set(_DTYPES)))}")
    return getattr(torch, _DTYPES[name])


def _prepare_device(device: str, num_threads: int):
    import torch

    if num_threads > 0:
        torch.set_num_threads(num_threads)
    if device.startswith("npu"):
        try:
            import torch_npu  # noqa: F401  (registers the npu device with torch)
        except ImportError as error:
            raise EngineError("engine.device='npu' needs torch_npu (pip install -e .[npu] on an Ascend host)") from error
    elif device.startswith("cuda") and not torch.cuda.is_available():
        raise EngineError(f"engine.device={device!r} but torch sees no CUDA device; use engine.device=cpu")
    return torch.device(device)


def load_tokenizer(path: str | Path):
    """The tokenizer of a local checkpoint directory (whatever class its
    tokenizer_config.json names: the tiny policy's, Qwen2's, ...), padding on the left
    (generation batches prompts; ``pad_batch`` lays them out the same way). A tokenizer
    without a pad token pads with its end-of-text token (only masked positions hold it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise EngineError(f"the tokenizer at {path} has neither a pad nor an end-of-text token; "
                              "set eos_token in its tokenizer_config.json")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(path: str | Path, device: str = "cpu", dtype: str = "float32", num_threads: int = 0):
    """Load (model, tokenizer) from a local checkpoint directory, in eval mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per actor per weight load is noise

    path = Path(path)
    if not (path / "config.json").is_file():
        raise EngineError(
            f"no checkpoint at {path} (config.json missing); train the tiny policy with "
            "`python scripts/train_tiny_policy.py` or set model.path to a local checkpoint"
        )
    torch_device = _prepare_device(device, num_threads)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=_torch_dtype(dtype))
    model.to(torch_device).eval()
    return model, load_tokenizer(path)


def pad_batch(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], pad_id: int):
    """The shared layout: [left-padded prompt | right-padded response].

    Returns (input_ids, attention_mask, position_ids, response_mask), all [B, P+R], where
    response_mask marks the positions of response tokens.
    """
    import torch

    P = max(len(p) for p in prompt_ids)
    R = max((len(r) for r in response_ids), default=0)
    B = len(prompt_ids)
    input_ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attention = torch.zeros((B, P + R), dtype=torch.long)
    response_mask = torch.zeros((B, P + R), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        input_ids[i, P - len(p):P] = torch.as_tensor(p, dtype=torch.long)
        attention[i, P - len(p):P] = 1
        if len(r):
            input_ids[i, P:P + len(r)] = torch.as_tensor(r, dtype=torch.long)
            attention[i, P:P + len(r)] = 1
            response_mask[i, P:P + len(r)] = True
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention, position_ids, response_mask


def token_logprobs(model, prompt_ids, response_ids, pad_id: int, temperature: float = 1.0):
    """Per-token log-probs of the responses under ``model``: ([B, R], mask [B, R]).

    Differentiable; callers wrap it in ``torch.no_grad()`` when they only evaluate.
    """
    import torch

    device = next(model.parameters()).device
    input_ids, attention, position_ids, response_mask = pad_batch(prompt_ids, response_ids, pad_id)
    P = max(len(p) for p in prompt_ids)
    logits = model(
        input_ids=input_ids.to(device), attention_mask=attention.to(device), position_ids=position_ids.to(device)
    ).logits
    # logits at position t predict token t+1: the response starts at P, so read P-1 ... end-1.
    logits = logits[:, P - 1:-1].float() / temperature
    targets = input_ids[:, P:].to(device)
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logprobs, response_mask[:, P:].to(device)


def response_logprobs(model, prompt_ids, response_ids, pad_id: int, temperature: float = 1.0) -> list[list[float]]:
    """:func:`token_logprobs` without gradient, one list of floats per response."""
    import torch

    with torch.no_grad():
        values, mask = token_logprobs(model, prompt_ids, response_ids, pad_id, temperature)
    return [v[m].tolist() for v, m in zip(values.cpu(), mask.cpu())]


def _warpers(sampling: SamplingParams) -> list:
    """Temperature, top-k, top-p, min-p as HF applies them (same order), or none where neutral."""
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = []
    if sampling.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=sampling.top_k))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=sampling.top_p))
    if sampling.min_p > 0.0:
        warpers.append(MinPLogitsWarper(min_p=sampling.min_p))
    return warpers


def _sampled_token_logprobs():
    """A logits processor, last in the chain, that records log p(sampled token) per step.

    At step t it holds log_softmax of the scores the sampler draws from; at step t+1 the
    token drawn at t is the last column of ``input_ids`` and its log-prob is gathered;
    ``finish(sequences)`` gathers the last step's. One [batch, vocab] buffer at a time."""
    import torch
    from transformers import LogitsProcessor

    class SampledTokenLogprobs(LogitsProcessor):
        def __init__(self):
            self.previous = None
            self.chosen: list = []

        def _take(self, tokens):
            self.chosen.append(self.previous.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))

        def __call__(self, input_ids, scores):
            if self.previous is not None:
                self._take(input_ids[:, -1])
            self.previous = torch.log_softmax(scores.float(), dim=-1)
            return scores

        def finish(self, sequences):
            """[batch, generated steps] log-probs of the sampled tokens."""
            if self.previous is not None:
                self._take(sequences[:, -1])
                self.previous = None
            if not self.chosen:
                return torch.zeros((sequences.shape[0], 0))
            return torch.stack(self.chosen, dim=1)

    return SampledTokenLogprobs()


class HFReferencePolicy:
    """A frozen copy of the starting policy, for the KL term of GRPO (``algo.kl_coef > 0``)."""

    def __init__(self, path: str | Path, device: str = "cpu", dtype: str = "float32", num_threads: int = 0,
                 temperature: float = 1.0):
        self.model, tokenizer = load_policy(path, device, dtype, num_threads)
        self.model.requires_grad_(False)
        self.pad_id = tokenizer.pad_token_id
        self.temperature = temperature

    def logprobs(self, prompt_ids, response_ids) -> list[list[float]]:
        return response_logprobs(self.model, prompt_ids, response_ids, self.pad_id, self.temperature)


class HFGenerationEngine:
    """Batched sampling with ``model.generate``; one instance per generation actor."""

    def __init__(self, path: str | Path, device: str = "cpu", dtype: str = "float32", num_threads: int = 0):
        self.model, self.tokenizer = load_policy(path, device, dtype, num_threads)
        self.pad_id = self.tokenizer.pad_token_id
        self.eos_id = self.tokenizer.eos_token_id
        self.weight_version = 0

    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> GenerationOutput:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
            raise EngineError("generate() needs a non-empty list of non-empty prompts")
        start = time.time()
        input_ids, attention, _, _ = pad_batch(prompt_ids, [[] for _ in prompt_ids], self.pad_id)
        device = next(self.model.parameters()).device
        # The warpers go into our own processor list so that the recorder runs after them
        # (HF appends its own warpers after custom processors); HF's are all neutral here.
        recorder = _sampled_token_logprobs()
        processors = LogitsProcessorList(_warpers(sampling) + [recorder])
        config = GenerationConfig(
            do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
            max_new_tokens=sampling.max_tokens, pad_token_id=self.pad_id, eos_token_id=self.eos_id,
            return_dict_in_generate=True, output_scores=False,
        )
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=config,
                logits_processor=processors,
            )
        generated = out.sequences[:, input_ids.shape[1]:].cpu()
        chosen = recorder.finish(out.sequences).cpu()
        responses, logprobs, finished = [], [], []
        for row, row_logprobs in zip(generated.tolist(), chosen.tolist()):
            end = row.index(self.eos_id) + 1 if self.eos_id in row else len(row)
            responses.append(row[:end])
            logprobs.append(row_logprobs[:end])
            finished.append(self.eos_id in row)
        return GenerationOutput(
            prompt_ids=[list(p) for p in prompt_ids], response_ids=responses, response_logprobs=logprobs,
            finished=finished, weight_version=self.weight_version, start_time=start, end_time=time.time(),
        )

    def load_weights(self, snapshot: WeightSnapshot) -> None:
        missing, unexpected = self.model.load_state_dict(dict(snapshot.tensors), strict=False)
        # Tied embeddings may be exported once; anything else missing is a real mismatch.
        missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise EngineError(f"snapshot v{snapshot.version} does not fit the model: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
        self.weight_version = snapshot.version


def backward_micro_batch(loss_fn: LossFn, values, mask, batch: TrainBatch, index: list[int],
                         totals: dict[str, float]) -> None:
    """The micro-batch rule of every hf trainer, one rank or many: the loss of rows
    ``index`` is scaled by their share of the *whole* batch, ``len(index) / len(batch)``,
    so the accumulated gradient is the whole batch's loss gradient however the rows are
    cut into micro-batches and ranks (the ranks' gradients are summed, not averaged).
    The micro-batch's metrics are added into ``totals`` with the same weight."""
    loss, metrics = loss_fn(values, mask, batch, index)
    share = len(index) / len(batch)
    (loss * share).backward()
    for key, value in metrics.items():
        totals[key] = totals.get(key, 0.0) + float(value) * share


class HFTrainingEngine:
    """AdamW on the policy, with micro-batch gradient accumulation."""

    def __init__(self, path: str | Path, device: str = "cpu", dtype: str = "float32", num_threads: int = 0,
                 lr: float = 1e-4, weight_decay: float = 0.0, clip_grad: float = 1.0, micro_batch_size: int = 8,
                 temperature: float = 1.0, betas: tuple[float, float] = (0.9, 0.999)):
        import torch

        self.model, self.tokenizer = load_policy(path, device, dtype, num_threads)
        self.model.train()
        self.pad_id = self.tokenizer.pad_token_id
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay,
                                           betas=tuple(betas))
        self.clip_grad = clip_grad
        self.micro_batch_size = micro_batch_size
        self.temperature = temperature
        self.version = 0

    def logprobs(self, prompt_ids, response_ids, temperature: float | None = None) -> list[list[float]]:
        temperature = self.temperature if temperature is None else temperature
        return response_logprobs(self.model, prompt_ids, response_ids, self.pad_id, temperature)

    def train_step(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer update over the whole batch; the version advances by one."""
        import torch

        if len(batch) == 0:
            raise EngineError("train_step() got an empty batch")
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        n = len(batch)
        for start in range(0, n, self.micro_batch_size):
            index = list(range(start, min(n, start + self.micro_batch_size)))
            values, mask = token_logprobs(
                self.model, [batch.prompt_ids[i] for i in index], [batch.response_ids[i] for i in index],
                self.pad_id, self.temperature,
            )
            backward_micro_batch(loss_fn, values, mask, batch, index, totals)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad)
        self.optimizer.step()
        self.version += 1
        totals["grad_norm"] = float(grad_norm)
        return totals

    def export_weights(self) -> WeightSnapshot:
        tensors = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        return WeightSnapshot(version=self.version, tensors=tensors)

    def state_tensors(self) -> dict:
        """The live parameters and buffers, name -> tensor, not copied (tied weights stay one
        tensor): for transports that make their own copy (files, collective)."""
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def save(self, path: str | Path) -> None:
        """A Hugging Face checkpoint directory (config, safetensors weights, tokenizer)."""
        self.model.save_pretrained(str(path), safe_serialization=True)
        self.tokenizer.save_pretrained(str(path))

    def optimizer_state(self) -> dict | None:
        """AdamW's state keyed by parameter name (torch.distributed.checkpoint's full form),
        so that a checkpoint loads into any number of ranks; None on ranks other than 0."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_optimizer_state(self, state: dict | None) -> None:
        """Restore :meth:`optimizer_state` (the weights are loaded with the model)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state, options=StateDictOptions(full_state_dict=True))


def nll_loss(values, mask, batch: TrainBatch, index) -> tuple:
    """Supervised fine-tuning: mean negative log-likelihood of the response tokens."""
    count = mask.sum().clamp(min=1)
    loss = -(values * mask).sum() / count
    return loss, {"loss": float(loss.detach())}
