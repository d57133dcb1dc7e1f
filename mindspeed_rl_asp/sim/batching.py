"""How long an inference instance takes for one minibatch, by the engine's batching style.

Pure functions over the cost models of ``costs.py``: a minibatch is ``rows`` sequences
(its prompts x n samples) with known prompt and response lengths; the result is its
duration and the bubble measures docs/simulator.md defines:

* ``static`` (HF ``generate``): all rows (up to ``max_num_seqs`` at a time) are
  prefilled together, left-padded to the longest prompt, and decoded until the longest
  response ends. A finished row keeps its slot (padding): every step costs a full batch.
  Bubble: the share of decode slots held by finished rows, ``1 - sum(L) / (rows x max L)``.
* ``continuous`` (vLLM): sequences join the running batch while a slot (``max_num_seqs``)
  and KV-cache room are free, and leave the step after their last token; a new sequence
  is prefilled when it joins. The minibatch is done when its last sequence ends. Bubble:
  the running batch's shortfall below its capacity over the minibatch's life
  (``1 - sequence-steps / (capacity x steps)``), and the *tail*: the time with fewer than
  a quarter of the capacity still running (a few long answers holding the instance).

KV room is reserved for a sequence's whole final length when it joins, so nothing is
ever preempted; vLLM reserves block by block and preempts on overflow, which this
ignores (with ``kv_memory_fraction`` sized as in the engine profiles, the paper's
geometry never comes near the limit: ``costs.kv_capacity_tokens``).

Sums of decode steps use a closed form (:func:`decode_steps_time`): between two
finishes the batch is constant and the cache grows by one token per running sequence
per step, so the memory-bound part of each step is linear in the step index.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..metrics.timeline import TAIL_SHARE  # "few sequences left": one definition for the sim and the runs
from typing import Optional

from .costs import Parallel, decode_step_parts, expected_distinct_experts, parallel_of, prefill_time
from .profiles import EngineProfile, HardwareProfile, ModelProfile


@dataclass(frozen=True)
class Instance:
    """One inference instance: a model replica on ``devices`` devices, attention and
    dense weights split ``tp`` ways and experts ``ep`` ways (None: over every device)."""

    model: ModelProfile
    hardware: HardwareProfile
    engine: EngineProfile
    devices: int
    kv_capacity_tokens: int
    tp: Optional[int] = None
    ep: Optional[int] = None

    @property
    def max_num_seqs(self) -> int:
        return self.engine.max_num_seqs

    @property
    def parallel(self) -> Parallel:
        return parallel_of(self.model, self.devices, self.tp, self.ep)


@dataclass(frozen=True)
class MinibatchTiming:
    duration: float          # seconds from start to the last token
    decode_steps: int        # engine steps
    prefill_s: float
    slot_bubble: float       # static: slots held by finished rows; continuous: shortfall below capacity
    tail_s: float            # seconds with fewer than TAIL_SHARE x capacity sequences running
    capacity: int            # running-batch capacity (sequences)


def decode_steps_time(inst: Instance, batch: int, steps: int, kv_start: float, kv_growth: float) -> float:
    """Seconds of ``steps`` decode steps of a constant ``batch`` whose cache holds
    ``kv_start + j * kv_growth`` tokens at step ``j``.

    Step ``j`` costs ``constant + max(a + c j, d)`` (``costs.decode_step_parts``): memory
    time ``a + c j`` (the busiest device's weights and experts plus its share of the
    cache, over its effective bandwidth) against the floor ``d`` (compute, or an eager
    engine's launches). The first ``j*`` steps sit on the floor (``a + c j < d``), the
    rest are memory-bound, so the sum is ``steps x constant + j* x d + the linear part``.
    """
    if steps <= 0:
        return 0.0
    model, hw = inst.model, inst.hardware
    par = inst.parallel
    bandwidth = hw.hbm_bandwidth * hw.inference_bandwidth_efficiency
    experts = expected_distinct_experts(model.num_experts, model.num_experts_per_tok, batch)
    weights = model.decode_dense_bytes / par.tp + model.num_layers * experts * model.expert_bytes / par.expert_shards
    a = (weights + kv_start * model.kv_bytes_per_token / par.devices) / bandwidth
    c = kv_growth * model.kv_bytes_per_token / par.devices / bandwidth
    constant, d = decode_step_parts(model, hw, inst.engine, par, batch)
    if c <= 0.0:
        compute_steps = steps if a < d else 0
    else:
        compute_steps = min(steps, max(0, math.ceil((d - a) / c)))
    n, k = steps, compute_steps
    linear = (n - k) * a + c * (n * (n - 1) - k * (k - 1)) / 2.0
    return n * constant + k * d + linear


def _prefill(inst: Instance, tokens: int, squares: float) -> float:
    """``tokens`` prompt tokens whose sequences' squared lengths sum to ``squares`` (attention)."""
    if tokens <= 0:
        return 0.0
    return prefill_time(inst.model, inst.hardware, inst.devices, tokens, inst.engine.execution == "serial", squares)


def static_minibatch(inst: Instance, prompt_lengths: Sequence[int], response_lengths: Sequence[int]) -> MinibatchTiming:
    """HF-style static batching; rows beyond ``max_num_seqs`` run as further batches."""
    rows = len(response_lengths)
    chunk = max(1, inst.max_num_seqs)
    duration = prefill_total = 0.0
    steps = 0
    used = held = 0
    for start in range(0, rows, chunk):
        prompts = prompt_lengths[start:start + chunk]
        lengths = response_lengths[start:start + chunk]
        b, longest, padded_prompt = len(lengths), max(lengths), max(prompts)
        pre = inst.engine.call_overhead + _prefill(inst, b * padded_prompt, b * padded_prompt ** 2)
        # The first token comes out of the prefill; the rest are decode steps of the full batch.
        decode = decode_steps_time(inst, b, longest - 1, b * (padded_prompt + 1), b)
        duration += pre + decode
        prefill_total += pre
        steps += longest - 1
        used += sum(lengths)
        held += b * longest
    bubble = 1.0 - used / held if held else 0.0
    return MinibatchTiming(duration, steps, prefill_total, bubble, 0.0, min(rows, chunk))


def continuous_minibatch(inst: Instance, prompt_lengths: Sequence[int],
                         response_lengths: Sequence[int]) -> MinibatchTiming:
    """vLLM-style continuous batching, first come first served (rows in order)."""
    rows = len(response_lengths)
    waiting = list(range(rows))
    waiting.reverse()                     # pop() takes the next in order
    remaining: dict[int, int] = {}        # running row -> tokens still to generate
    reserved = cached = 0                 # KV tokens reserved / held by running rows
    capacity = max(1, min(inst.max_num_seqs, rows))
    t = prefill_total = inst.engine.call_overhead
    tail = 0.0
    steps = seq_steps = 0
    while waiting or remaining:
        joined = joined_squares = 0
        while waiting and len(remaining) < inst.max_num_seqs:
            row = waiting[-1]
            need = prompt_lengths[row] + response_lengths[row]
            if remaining and reserved + need > inst.kv_capacity_tokens:
                break                     # wait for a finish to free cache
            waiting.pop()
            reserved += need
            cached += prompt_lengths[row] + 1     # the prefill emits the first token
            joined += prompt_lengths[row]
            joined_squares += prompt_lengths[row] ** 2
            remaining[row] = response_lengths[row] - 1
        pre = _prefill(inst, joined, joined_squares)
        t += pre
        prefill_total += pre
        done = [r for r, left in remaining.items() if left <= 0]
        if not done:
            b = len(remaining)
            n = min(remaining.values())
            dt = decode_steps_time(inst, b, n, cached, b)
            t += dt
            if b < TAIL_SHARE * capacity:
                tail += dt
            steps += n
            seq_steps += b * n
            cached += b * n
            for r in remaining:
                remaining[r] -= n
            done = [r for r, left in remaining.items() if left <= 0]
        for r in done:
            del remaining[r]
            reserved -= prompt_lengths[r] + response_lengths[r]
            cached -= prompt_lengths[r] + response_lengths[r]
    bubble = 1.0 - seq_steps / (capacity * steps) if steps else 0.0
    return MinibatchTiming(t, steps, prefill_total, bubble, tail, capacity)


BATCHING = {"static": static_minibatch, "continuous": continuous_minibatch}


def minibatch_timing(inst: Instance, prompt_lengths: Sequence[int], response_lengths: Sequence[int]) -> MinibatchTiming:
    """The engine's batching style decides (``engine.batching``)."""
    return BATCHING[inst.engine.batching](inst, prompt_lengths, response_lengths)


def lone_sequence_time(inst: Instance, prompt_tokens: int, response_tokens: int) -> float:
    """Seconds for one sequence decoding alone on the instance (batch 1): its prefill and
    ``response - 1`` decode steps with its cache growing by one token a step. No
    scheduling of other work can make a minibatch that holds it end sooner: the latency
    bound of docs/simulator.md."""
    if response_tokens <= 0:
        return 0.0
    return (_prefill(inst, max(prompt_tokens, 1), max(prompt_tokens, 1) ** 2)
            + decode_steps_time(inst, 1, response_tokens - 1, prompt_tokens + 1, 1))


def full_batch_token_rate(inst: Instance, mean_prompt: float, mean_response: float) -> float:
    """Tokens/s of an instance whose running batch is always full (``max_num_seqs``, or
    what the KV cache holds at the mean sequence length), the cache at its mean fill,
    prefill included per generated token: the zero-bubble rate the lower bound uses."""
    batch = max(1, min(inst.max_num_seqs, int(inst.kv_capacity_tokens // max(mean_prompt + mean_response, 1.0))))
    step = decode_steps_time(inst, batch, 1, batch * (mean_prompt + mean_response / 2.0), 0.0)
    prefill = _prefill(inst, max(1, round(batch * mean_prompt)), batch * mean_prompt ** 2)
    return 1.0 / (step / batch + prefill / (batch * max(mean_response, 1.0)))
