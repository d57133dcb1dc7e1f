"""Minibatch partitioning of length-sorted prompts by dynamic programming.

Problem. ``lengths`` holds the predicted response lengths of N prompts sorted
ascending. We cut the sequence into contiguous minibatches whose sizes (counted in
PROMPTS, not samples) lie in ``[lo, hi] = [base - slack, base + slack]`` and
minimise the total padded work ``sum(size * max_len)``. Because the input is
sorted, the max of block ``[i, j)`` is ``lengths[j - 1]``, so the cost of a block
is ``(j - i) * lengths[j - 1]`` and the DP over prefix ends is

    dp[0] = 0,    dp[j] = min_{s in [lo, hi], s <= j} dp[j - s] + s * lengths[j - 1] + price.

That is O(N * window) with ``window = hi - lo + 1 = 2 * slack + 1`` (not O(N^2)).
Any block cost ``cost_fn(size, max_len)`` works unchanged (the planner passes its
minibatch load model so that cuts and balancing agree).

Minibatch price. With pure padded work a smaller block never costs more, so the
unpriced DP collapses to ``lo``-sized blocks: sizes do not float around ``base``,
there are ~``base/lo`` times more dispatches, and the many small, steeply rising
loads are hard to balance. ``priced_partition`` adds a per-minibatch ``price``
(a Lagrange multiplier on the minibatch count) and searches it so the count is
the fixed-size count ``ceil(N / base)`` (or the nearest count above it): blocks
grow to ``hi`` where lengths are flat and shrink to ``lo`` in the steep tail.
Lagrangian optimality: a partition minimising ``work + price * count`` has
minimal work among all partitions with at most its count.

Remainder rule (exact cover). When N is not a sum of sizes in ``[lo, hi]`` (e.g.
``slack = 0`` and ``N % base != 0``, or ``N < lo``), exactly ONE remainder
minibatch of size ``r < lo`` is allowed. Its size and its POSITION are chosen by the
DP optimally among all ``r`` with ``N - r`` representable (on exact ties: the
regular part wins, which pushes the remainder toward the short end). ``N < lo``
therefore gives a single minibatch of all N prompts. When N is representable no
remainder is ever used, so every size lies in ``[lo, hi]``.

Ties between equally cheap partitions are broken toward sizes closest to ``base``
(then toward the larger size), so equal lengths give regular ``base``-sized
minibatches instead of an arbitrary mix.

Speed. ``dp[j]`` only reads ``dp[j - hi .. j - lo]``, so the ``lo`` consecutive
prefix ends of a block never depend on each other; the loop advances ``lo``
positions per step with one numpy reduction over a ``(lo, window)`` matrix.
"""
from __future__ import annotations

import numpy as np

__all__ = [
    "ScheduleError",
    "size_bounds",
    "is_representable",
    "padded_cost",
    "dp_partition",
    "priced_partition",
    "fixed_partition",
    "padded_work",
    "offsets",
]

# Cost-matrix rows built at once; bounds the temporary to CHUNK * window floats.
_CHUNK = 1 << 16


class ScheduleError(ValueError):
    """Invalid scheduler input or parameters; the message names the bad value."""


def size_bounds(base_batch_size: int, slack: int) -> tuple[int, int]:
    """Return ``(lo, hi)`` minibatch size bounds in prompts; validates the pair."""
    if base_batch_size <= 0:
        raise ScheduleError(f"base_batch_size={base_batch_size} must be > 0")
    if slack < 0:
        raise ScheduleError(f"slack={slack} must be >= 0")
    if slack >= base_batch_size:
        raise ScheduleError(
            f"slack={slack} must be < base_batch_size={base_batch_size} "
            "(slack larger than base would allow empty minibatches)"
        )
    return base_batch_size - slack, base_batch_size + slack


def is_representable(n: int, lo: int, hi: int) -> bool:
    """True iff ``n`` is a sum of integers in ``[lo, hi]`` (0 is the empty sum).

    k parts cover exactly ``[k*lo, k*hi]``, so n works iff some k has
    ``ceil(n / hi) <= k <= floor(n / lo)``.
    """
    return n == 0 or -(-n // hi) <= n // lo


def _preference(lo: int, hi: int, base: int) -> np.ndarray:
    """Sizes in tie-break order: closest to base first, larger size first on equal distance."""
    sizes = np.arange(hi, lo - 1, -1)
    return sizes[np.argsort(np.abs(sizes - base), kind="stable")]


def padded_cost(sizes: np.ndarray, max_lengths: np.ndarray) -> np.ndarray:
    """Default block cost: padded work ``size * max_len`` (broadcasts)."""
    return np.multiply(sizes, max_lengths, dtype=np.float64)


def _dp_layer(lengths: np.ndarray, sizes: np.ndarray, start: float, cost_fn,
              extra: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One DP layer: ``dp[j] = min(min_c dp[j - sizes[c]] + cost(sizes[c], L[j-1]), extra[j])``.

    ``dp[0] = start``. ``sizes`` are the regular part sizes in tie-break order
    (the first minimal column wins). ``extra`` optionally offers one more
    candidate per prefix end (the remainder transitions, precomputed from the
    layer without remainder); regular parts win ties. Returns ``(dp, col)``:
    ``col[j]`` is the winning column, ``-1`` when ``extra`` won; meaningless
    where ``dp[j]`` is infinite (unreachable).
    """
    n = len(lengths)
    lo, hi = int(sizes.min()), int(sizes.max())
    off = hi  # dp[off + j] holds prefix end j; the front pad reads as +inf
    dp = np.full(n + 1 + off, np.inf)
    dp[off] = start
    col = np.zeros(n + 1, dtype=np.int8)
    # gather[r, c]: index into dp[off + b - hi:] of dp[j - sizes[c]] for j = b + r
    gather = np.arange(lo)[:, None] - sizes[None, :] + hi
    chunk = lo * max(1, _CHUNK // lo)  # whole blocks per chunk of the cost matrix
    for c0 in range(1, n + 1, chunk):
        c1 = min(n + 1, c0 + chunk)
        cost = np.asarray(cost_fn(sizes[None, :], lengths[c0 - 1:c1 - 1, None]), dtype=np.float64)
        for b in range(c0, c1, lo):  # the lo prefix ends b..b+lo-1 only read dp[< b]
            k = min(lo, c1 - b)
            cand = dp[off + b - hi: off + b + lo].take(gather if k == lo else gather[:k])
            cand += cost[b - c0: b - c0 + k]
            if extra is None:
                col[b: b + k] = cand.argmin(axis=1)
                dp[off + b: off + b + k] = cand.min(axis=1)
            else:
                arg, best = cand.argmin(axis=1), cand.min(axis=1)
                use = extra[b: b + k] < best
                col[b: b + k] = np.where(use, -1, arg)
                dp[off + b: off + b + k] = np.where(use, extra[b: b + k], best)
    return dp[off:], col


def _backtrack(sizes: np.ndarray, col0: np.ndarray, n: int,
               col1: np.ndarray | None = None, rem: np.ndarray | None = None) -> np.ndarray:
    """Part sizes in order, walking the winning columns back from ``n``.

    Starts in the remainder layer (``col1``) when given; its ``-1`` column is the
    remainder part of size ``rem[j]``, after which the walk continues in layer 0.
    """
    table = sizes.tolist()
    parts: list[int] = []
    layer = col0 if col1 is None else col1
    j = n
    while j > 0:
        c = int(layer[j])
        if c < 0:
            s, layer = int(rem[j]), col0
        else:
            s = table[c]
        parts.append(s)
        j -= s
    return np.array(parts[::-1], dtype=np.int64)


def dp_partition(lengths: np.ndarray, base_batch_size: int, slack: int,
                 cost_fn=padded_cost, price: float = 0.0) -> np.ndarray:
    """Optimal minibatch sizes (in prompts, in order) for ascending ``lengths``.

    Invariants: the sizes sum to ``len(lengths)``; all lie in ``[lo, hi]`` except,
    only when ``len(lengths)`` is not representable, exactly one remainder
    ``< lo``; ``sum(cost_fn(size, last length of the block) + price)`` is minimal
    over all partitions obeying those rules (see module docstring).
    ``cost_fn(sizes, max_lengths)`` must broadcast elementwise and return finite
    values; the default is the padded work.
    """
    if price:
        base_cost = cost_fn

        def cost_fn(sizes, max_lengths):  # noqa: F811 - the priced block cost
            return np.asarray(base_cost(sizes, max_lengths), dtype=np.float64) + price

    lengths = np.asarray(lengths, dtype=np.float64)
    lo, hi = size_bounds(base_batch_size, slack)
    n = len(lengths)
    if n == 0:
        raise ScheduleError("no prompts to partition: empty input")
    if np.any(np.diff(lengths) < 0):
        raise ScheduleError("dp_partition needs lengths sorted ascending")
    sizes = _preference(lo, hi, base_batch_size)
    dp0, col0 = _dp_layer(lengths, sizes, 0.0, cost_fn)
    if np.isfinite(dp0[n]):
        return _backtrack(sizes, col0, n)
    # Exactly one remainder r < lo with n - r representable; the DP places it.
    # |rems| is 1 unless n is tiny: with slack > 0 every n >= lo * lo is representable.
    rems = [r for r in range(1, min(lo, n + 1)) if is_representable(n - r, lo, hi)]
    extra = np.full(n + 1, np.inf)
    rem = np.zeros(n + 1, dtype=np.int64)
    for r in rems:
        cand = np.full(n + 1, np.inf)
        cand[r:] = dp0[: n + 1 - r] + np.asarray(cost_fn(np.int64(r), lengths[r - 1:]), dtype=np.float64)
        better = cand < extra
        extra[better] = cand[better]
        rem[better] = r
    _, col1 = _dp_layer(lengths, sizes, np.inf, cost_fn, extra)
    return _backtrack(sizes, col0, n, col1, rem)


def _window_sample(lengths: np.ndarray, limit: int, width: int = 256) -> np.ndarray:
    """Evenly spaced windows of consecutive sorted lengths (at most ``limit`` values).

    Windows keep the local spacing of the sorted lengths, which is what the DP's
    size choices depend on, so a count measured on the sample scales by
    ``N / len(sample)`` up to the window-edge effects.
    """
    n = len(lengths)
    if n <= limit:
        return lengths
    starts = np.linspace(0, n - width, limit // width).astype(np.int64)
    return lengths[(starts[:, None] + np.arange(width)[None, :]).ravel()]


def _solve_price(run, target: float, upper: float, price: float, elasticity: float,
                 max_runs: int) -> tuple[np.ndarray | None, float]:
    """Find a price whose block count ``len(run(price))`` lies in ``[target, upper]``.

    The count is non-increasing in the price and roughly a power law locally, so
    the search works on ``(log price, log count)``: Newton steps with the given
    ``elasticity`` (``-dlog count / dlog price``) until the target is bracketed,
    then regula falsi clipped to the inner 80% of the bracket (so the bracket
    shrinks every step). Returns the run with the smallest count ``>= target``
    (``None`` if no run reached the target) and its price.
    """
    goal = np.log((target + upper) / 2)
    best, best_price = None, 0.0
    lo = hi = None  # (log price, log count) with count > upper / count < target
    for _ in range(max_runs):
        sizes = run(price)
        c = len(sizes)
        if c >= target and (best is None or c < len(best)):
            best, best_price = sizes, price
        if target <= c <= upper:
            break
        point = (np.log(price), np.log(c))
        if c > upper:
            lo = point
        else:
            hi = point
        if lo is not None and hi is not None:
            if hi[0] - lo[0] < 1e-12:
                break
            t = (lo[1] - goal) / (lo[1] - hi[1]) if lo[1] > hi[1] else 0.5
            x = lo[0] + min(max(t, 0.1), 0.9) * (hi[0] - lo[0])
        else:
            x = point[0] + float(np.clip((point[1] - goal) / elasticity, -4.0, 4.0))
        price = float(np.exp(x))
    return best, best_price


def priced_partition(lengths: np.ndarray, base_batch_size: int, slack: int, cost_fn=padded_cost,
                     target: int | None = None, sample_limit: int = 1 << 15,
                     tol: float = 0.002) -> tuple[np.ndarray, float]:
    """DP sizes with the minibatch price set so the count is ``target`` (default ``ceil(N/base)``).

    Returns ``(sizes, price)``. Guarantee: the count is ``>= target`` unless the
    unpriced optimum already has fewer blocks (then ``price == 0``), and the
    work is minimal among partitions with at most that many blocks, so it never
    exceeds the work of the fixed-size sorted partition whenever that partition
    obeys the size rules. Up to ``sample_limit`` prompts the search aims at the
    exact target (it returns the smallest count ``>= target`` it met); above, the
    price is first searched on a window sample, then refined on the full input
    until the count is within ``tol`` (relative) above target (a few DP runs).
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    n = len(lengths)
    if target is None:
        target = -(-n // base_batch_size)

    def runner(values):
        return lambda price: dp_partition(values, base_batch_size, slack, cost_fn, price)

    def mean_block_cost(values, sizes):
        return float(np.mean(cost_fn(sizes, values[offsets(sizes)[1:] - 1]))) or 1.0

    if n <= sample_limit:
        free = runner(lengths)(0.0)
        if len(free) <= target:
            return free, 0.0
        best, price = _solve_price(runner(lengths), target, target, mean_block_cost(lengths, free), 0.15, 64)
        return (best, price) if best is not None else (free, 0.0)
    sample = _window_sample(lengths, sample_limit)
    t_s = target * len(sample) / n
    free_s = runner(sample)(0.0)
    # Unpriced optimum about as coarse as the target already (e.g. many tied lengths,
    # where any positive price makes the count jump far below target): check it in full.
    if len(free_s) <= t_s * 1.02:
        free = runner(lengths)(0.0)
        if len(free) <= target * (1 + tol):
            return free, 0.0
    _, guess = _solve_price(runner(sample), t_s, t_s * 1.002, mean_block_cost(sample, free_s), 0.15, 40)
    guess = guess or mean_block_cost(sample, free_s)
    c_a, c_b = len(runner(sample)(guess / 1.25)), len(runner(sample)(guess * 1.25))
    elasticity = max(np.log(c_a / c_b) / (2 * np.log(1.25)), 0.02)
    best, price = _solve_price(runner(lengths), target, target * (1 + tol), guess, elasticity, 8)
    if best is None:  # no priced run reached the target: the unpriced optimum always does
        return runner(lengths)(0.0), 0.0
    return best, price


def fixed_partition(n: int, base_batch_size: int) -> np.ndarray:
    """Sizes ``[base, ..., base, n % base]``: fixed size, the remainder LAST (fifo/sorted)."""
    if n <= 0:
        raise ScheduleError(f"cannot partition n={n} prompts: empty input")
    if base_batch_size <= 0:
        raise ScheduleError(f"base_batch_size={base_batch_size} must be > 0")
    full, rem = divmod(n, base_batch_size)
    return np.array([base_batch_size] * full + ([rem] if rem else []), dtype=np.int64)


def offsets(sizes: np.ndarray) -> np.ndarray:
    """Block start offsets ``[0, s0, s0+s1, ...]`` (length ``len(sizes) + 1``)."""
    return np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))


def padded_work(lengths: np.ndarray, sizes: np.ndarray) -> float:
    """``sum(size * max length in block)`` for contiguous blocks of ``lengths`` (any order)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    starts = offsets(np.asarray(sizes))[:-1]
    return float(np.sum(np.asarray(sizes) * np.maximum.reduceat(lengths, starts)))
