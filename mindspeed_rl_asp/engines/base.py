"""The two engine protocols of the system, and the plain data that crosses them.

Generation: generate a minibatch (tokens, per-token log-probs of the sampling policy,
lengths, timing), load the weights of a version. Training: log-probs, one update step,
export weights. Implementations (``hf``, ``vllm``, ``mindspeed``) import their heavy
stacks lazily, inside :func:`mindspeed_rl_asp.engines.registry.make_generation_engine`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable


class EngineError(RuntimeError):
    """An engine could not be built or used; the message says what to change."""


@dataclass(frozen=True)
class SamplingParams:
    """MindSpeed-RL's ``sampling_config`` names. ``top_k=0`` disables top-k."""

    max_tokens: int = 320
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None

    @classmethod
    def from_config(cls, sampling_config, seed: int | None = None) -> "SamplingParams":
        """From ``generate.sampling_config`` (a config node or a plain dict)."""
        get = sampling_config.get if isinstance(sampling_config, dict) else lambda k: getattr(sampling_config, k)
        min_p = sampling_config.get("min_p", 0.0) if isinstance(sampling_config, dict) else \
            getattr(sampling_config, "min_p", 0.0)
        return cls(max_tokens=get("max_tokens"), temperature=get("temperature"), top_p=get("top_p"),
                   top_k=get("top_k"), min_p=float(min_p or 0.0), seed=seed)


@dataclass
class GenerationOutput:
    """One generated minibatch, sample-major. Log-probs are those the sampler drew from.

    ``response_ids[i]`` ends with EOS when ``finished[i]``; otherwise it was cut at
    ``max_tokens``. ``weight_version`` is the policy version that produced every sample.
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    response_logprobs: list[list[float]]
    finished: list[bool]
    weight_version: int
    start_time: float
    end_time: float

    @property
    def response_lengths(self) -> list[int]:
        return [len(r) for r in self.response_ids]

    @property
    def num_tokens(self) -> int:
        return sum(self.response_lengths)

    @property
    def tokens_per_second(self) -> float:
        elapsed = self.end_time - self.start_time
        return self.num_tokens / elapsed if elapsed > 0 else float("nan")


@dataclass
class TrainBatch:
    """Samples for one update: token ids plus named per-sample values (advantages,
    behaviour log-probs, ...) that a loss function reads from ``extras``."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    extras: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.response_ids)


@dataclass
class WeightSnapshot:
    """The full set of policy tensors at one version (CPU tensors, name -> tensor)."""

    version: int
    tensors: Mapping[str, Any]


# loss_fn(token_logprobs [B, T], response_mask [B, T], batch, index) -> (loss, metrics);
# ``index`` selects the micro-batch's rows of the batch's extras.
LossFn = Callable[[Any, Any, TrainBatch, Sequence[int]], tuple[Any, dict[str, float]]]


@runtime_checkable
class GenerationEngine(Protocol):
    weight_version: int

    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> GenerationOutput: ...

    def load_weights(self, snapshot: WeightSnapshot) -> None: ...


@runtime_checkable
class TrainingEngine(Protocol):
    version: int

    def logprobs(
        self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], temperature: float = 1.0
    ) -> list[list[float]]: ...

    def train_step(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]: ...

    def export_weights(self) -> WeightSnapshot: ...
