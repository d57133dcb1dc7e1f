"""``LMLengthPredictor``: a small causal LM of the target's family, fine-tuned to read a
prompt and predict the log of its response length (the paper's length predictor).

The backbone is the decoder of a causal LM checkpoint (``AutoModel``: the transformer
without its LM head); a linear head maps the **mean-pooled** last hidden state of the
prompt tokens to one scalar, the standardised ``log1p(length)``. The head, the top
``train_layers`` decoder layers (2 by default; None: all) and the final norm are trained
together with AdamW on the mean squared error; the rest of the backbone stays frozen. A
saved predictor holds only what was trained and names the backbone it was trained on
(``model_path``), so a run's ``length_predictor/`` is not a copy of the model.

Why regression (MSE on standardised log-length) rather than a pairwise ranking loss:

* the scheduler sorts by the prediction *and* uses its magnitude (minibatch loads,
  group balancing); a ranking loss only fixes the order, and its scale is arbitrary;
* a prompt's lengths are noisy (GRPO samples, epochs): the MSE minimiser is the
  conditional mean of ``log1p(length)`` given the prompt, which is exactly the
  quantity to sort by, and several observations of one prompt collapse into one
  weighted example (``sum_i (f - y_i)^2 = n (f - mean y)^2 + const``), so repeated
  samples cost no extra compute;
* it is O(n) per epoch instead of O(n^2) pairs, and its loss is easy to read.

Mean pooling (rather than the last token) averages over every prompt position; on
small data sets it trains faster and more stably, and ``pooling="last"`` is there for
long prompts where the final state summarises the prompt best.

Batches are right-padded with an attention mask (causal attention: real tokens never
see the padding), sorted into length buckets to keep padding small. ``torch`` and
``transformers`` are imported inside the methods only, so importing this module (or
``predictors.PREDICTORS``) stays light.

On this machine ``model_path`` defaults to the shipped tiny maze policy (a 0.8M
parameter Qwen3); on a cluster pass a directory of the target's family, e.g. a
Qwen2.5-1.5B checkout, with ``device="cuda"`` (or ``"npu"``) and ``dtype="bfloat16"``.
"""
from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ..config.paths import package_path
from .observations import observed_lengths

__all__ = ["LMLengthPredictor", "DEFAULT_MODEL_PATH"]

# The shipped tiny policy, found in the installed package (importlib.resources).
DEFAULT_MODEL_PATH = package_path("assets", "tiny-maze-qwen3")
POOLINGS = ("mean", "last")


def _check_prompts(prompts: Sequence[str]) -> list[str]:
    prompts = list(prompts)
    for k, p in enumerate(prompts):
        if not isinstance(p, str):
            raise ValueError(f"prompt {k} must be a str, got {type(p).__name__} {p!r:.60}")
    return prompts


def check_settings(*, pooling, epochs, batch_size, predict_batch_size, lr, head_lr, weight_decay, warmup, clip_grad,
                   max_prompt_tokens, num_threads, train_layers) -> None:
    """A ValueError naming the first setting of :class:`LMLengthPredictor` out of its range."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling={pooling!r} is not one of {', '.join(POOLINGS)}")
    for name, value in (("epochs", epochs), ("batch_size", batch_size), ("predict_batch_size", predict_batch_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an int >= 1")
    for name, value in (("lr", lr), ("head_lr", head_lr)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name}={value!r} must be a finite number > 0")
    if not (math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay={weight_decay!r} must be finite and >= 0")
    if not (0 <= warmup < 1):
        raise ValueError(f"warmup={warmup!r} must lie in [0, 1)")
    if not (math.isfinite(clip_grad) and clip_grad > 0):
        raise ValueError(f"clip_grad={clip_grad!r} must be finite and > 0")
    if max_prompt_tokens is not None and (not isinstance(max_prompt_tokens, int) or max_prompt_tokens < 1):
        raise ValueError(f"max_prompt_tokens={max_prompt_tokens!r} must be None or an int >= 1")
    if not isinstance(num_threads, int) or num_threads < 0:
        raise ValueError(f"num_threads={num_threads!r} must be an int >= 0")
    if train_layers is not None and (not isinstance(train_layers, int) or train_layers < 1):
        raise ValueError(f"train_layers={train_layers!r} must be None (all) or an int >= 1")


class LMLengthPredictor:
    """Fine-tune a causal LM backbone + linear head on (prompt, length) pairs.

    ``fit(prompts, lengths)`` starts from the pretrained weights at ``model_path``
    every time (it does not continue an earlier fit). ``predict(prompts)`` returns
    ``expm1`` of the predicted log-length (float64, >= 0).

    Parameters: ``model_path`` (a local checkpoint directory with ``config.json`` and
    a tokenizer; default: the shipped tiny maze policy), ``pooling`` (``"mean"`` or
    ``"last"``), ``epochs``, ``batch_size`` (prompts per step), ``lr`` (backbone),
    ``head_lr``, ``weight_decay``, ``warmup`` (fraction of steps with a linear warm-up;
    then linear decay to 0), ``clip_grad``, ``max_prompt_tokens`` (longer prompts
    keep their first tokens; default: the model's ``max_position_embeddings``),
    ``device``, ``dtype`` (backbone; the head and the loss are float32),
    ``num_threads`` (torch CPU threads during fit/predict, restored afterwards; 0
    leaves torch's setting), ``seed`` (head init, shuffling), ``predict_batch_size``.

    After ``fit``: ``loss_history_`` (mean training loss per epoch, in standardised
    units: 1.0 = predicting the mean), ``fit_seconds_``, ``num_parameters_``.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        pooling: str = "mean",
        epochs: int = 4,
        batch_size: int = 32,
        lr: float = 5e-4,
        head_lr: float = 3e-3,
        weight_decay: float = 0.01,
        warmup: float = 0.1,
        clip_grad: float = 1.0,
        max_prompt_tokens: int | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        num_threads: int = 0,
        seed: int = 0,
        predict_batch_size: int = 64,
        train_layers: int | None = 2,
    ):
        check_settings(pooling=pooling, epochs=epochs, batch_size=batch_size, predict_batch_size=predict_batch_size,
                       lr=lr, head_lr=head_lr, weight_decay=weight_decay, warmup=warmup, clip_grad=clip_grad,
                       max_prompt_tokens=max_prompt_tokens, num_threads=num_threads, train_layers=train_layers)
        self.train_layers = train_layers
        self.model_path = Path(model_path) if model_path is not None else DEFAULT_MODEL_PATH
        self.pooling = pooling
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = float(lr)
        self.head_lr = float(head_lr)
        self.weight_decay = float(weight_decay)
        self.warmup = float(warmup)
        self.clip_grad = float(clip_grad)
        self.max_prompt_tokens = max_prompt_tokens
        self.device = device
        self.dtype = dtype
        self.num_threads = num_threads
        self.seed = seed
        self.predict_batch_size = predict_batch_size
        self._backbone = None
        self._head = None
        self._tokenizer = None
        self._trained: set[str] = set()
        self.loss_history_: list[float] = []
        self.fit_seconds_ = float("nan")
        self.num_parameters_ = 0

    def __repr__(self) -> str:
        state = "fitted" if self._head is not None else "not fitted"
        return f"LMLengthPredictor(model_path={str(self.model_path)!r}, pooling={self.pooling!r}, {state})"

    # ------------------------------------------------------------------ helpers
    @contextlib.contextmanager
    def _threads(self):
        import torch

        before = torch.get_num_threads()
        if self.num_threads > 0:
            torch.set_num_threads(self.num_threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def _load(self):
        """Fresh (backbone, tokenizer) from ``model_path``."""
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        if not (self.model_path / "config.json").is_file():
            raise ValueError(f"model_path={str(self.model_path)!r} holds no checkpoint (config.json missing)")
        dtypes = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                  "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
        if self.dtype not in dtypes:
            raise ValueError(f"dtype={self.dtype!r} is not one of {', '.join(sorted(dtypes))}")
        if self.device.startswith("npu"):
            import torch_npu  # noqa: F401  (registers the npu device)
        hf_logging.disable_progress_bar()
        tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        backbone = AutoModel.from_pretrained(str(self.model_path), dtype=dtypes[self.dtype])
        return backbone.to(torch.device(self.device)), tokenizer

    def _encode(self, prompts: list[str]) -> list[list[int]]:
        limit = self.max_prompt_tokens
        if limit is None:
            limit = int(getattr(self._backbone.config, "max_position_embeddings", 0) or 4096)
        filler = self._tokenizer.eos_token_id
        filler = 0 if filler is None else int(filler)
        ids = self._tokenizer(prompts, add_special_tokens=False)["input_ids"]
        return [list(row[:limit]) if len(row) else [filler] for row in ids]

    def _forward(self, rows: list[list[int]]):
        """Standardised log-length predictions [B] (float32) for token rows."""
        import torch

        device = next(self._backbone.parameters()).device
        width = max(len(r) for r in rows)
        input_ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, :len(r)] = 1
        input_ids, mask = input_ids.to(device), mask.to(device)
        hidden = self._backbone(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
        if self.pooling == "mean":
            m = mask.unsqueeze(-1).float()
            pooled = (hidden * m).sum(1) / m.sum(1)
        else:
            last = mask.sum(1) - 1
            pooled = hidden[torch.arange(len(rows), device=device), last]
        return self._head(pooled).squeeze(-1)

    def _batches(self, order: np.ndarray, sizes: np.ndarray, batch_size: int, rng: np.random.Generator | None):
        """Cut ``order`` into batches of similar token length (buckets of 8 batches)."""
        batches = []
        bucket = 8 * batch_size
        for start in range(0, len(order), bucket):
            chunk = order[start:start + bucket]
            chunk = chunk[np.argsort(sizes[chunk], kind="stable")]
            batches += [chunk[k:k + batch_size] for k in range(0, len(chunk), batch_size)]
        if rng is not None:
            rng.shuffle(batches)
        return batches

    # ------------------------------------------------------------------ protocol
    def fit(self, prompts: Sequence[str], lengths: Sequence[float]) -> "LMLengthPredictor":
        import torch

        prompts = _check_prompts(prompts)
        y = observed_lengths(prompts, lengths)
        started = time.perf_counter()
        unique, weight, z = self._targets(prompts, y)
        with self._threads():
            torch.manual_seed(self.seed)
            trainable = self._fresh_model()
            rows = self._encode(unique)
            self._train(rows, z, weight, trainable)
            self._backbone.eval()
            self._head.eval()
        self.fit_seconds_ = time.perf_counter() - started
        return self

    def _targets(self, prompts: list[str], y: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(distinct prompts, observations of each, their standardised mean log-length);
        sets the scaling ``_mu`` / ``_sd``. One weighted example per distinct prompt has the
        same gradient as one per observation (module docstring)."""
        index: dict[str, int] = {}
        for p in prompts:
            index.setdefault(p, len(index))
        unique = list(index)
        which = np.fromiter((index[p] for p in prompts), dtype=np.int64, count=len(prompts))
        log_len = np.log1p(y)
        weight = np.bincount(which, minlength=len(unique)).astype(np.float64)
        target = np.bincount(which, weights=log_len, minlength=len(unique)) / weight
        self._mu = float(log_len.mean())
        sd = float(log_len.std())
        self._sd = sd if sd > 1e-8 else 1.0
        return unique, weight, (target - self._mu) / self._sd

    def _fresh_model(self) -> list:
        """Load the pretrained backbone, put a zero head on it (it starts at the mean length,
        no noise at init), freeze all but the trained parameters; returns those."""
        import torch

        self._backbone, self._tokenizer = self._load()
        hidden = int(self._backbone.config.hidden_size)
        device = next(self._backbone.parameters()).device
        self._head = torch.nn.Linear(hidden, 1).to(device)
        torch.nn.init.zeros_(self._head.weight)
        torch.nn.init.zeros_(self._head.bias)
        self._trained = trained_names(self._backbone, self.train_layers)
        for name, param in self._backbone.named_parameters():
            param.requires_grad_(name in self._trained)
        trainable = [p for n, p in self._backbone.named_parameters() if n in self._trained]
        self.num_parameters_ = sum(p.numel() for p in trainable) + hidden + 1
        return trainable

    def _train(self, rows: list[list[int]], z: np.ndarray, weight: np.ndarray, trainable: list) -> None:
        """``epochs`` passes of AdamW (linear warm-up, then linear decay to 0) on the weighted
        MSE; ``loss_history_`` gets each epoch's mean loss."""
        import torch

        device = next(self._backbone.parameters()).device
        sizes = np.array([len(r) for r in rows])
        z_t = torch.tensor(z, dtype=torch.float32, device=device)
        w_t = torch.tensor(weight, dtype=torch.float32, device=device)
        head = list(self._head.parameters())
        optimizer = torch.optim.AdamW([{"params": trainable, "lr": self.lr},
                                       {"params": head, "lr": self.head_lr, "weight_decay": 0.0}],
                                      weight_decay=self.weight_decay)
        total = self.epochs * math.ceil(len(rows) / self.batch_size)
        warm = max(1, int(self.warmup * total))
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min((s + 1) / warm, max(0.0, (total - s) / max(1, total - warm))))
        rng = np.random.default_rng(self.seed)
        self._backbone.train()
        self.loss_history_ = []
        for _ in range(self.epochs):
            seen, running = 0.0, 0.0
            for batch in self._batches(rng.permutation(len(rows)), sizes, self.batch_size, rng):
                bt = torch.as_tensor(batch, device=device)
                w = w_t[bt]
                loss = (w * (self._forward([rows[k] for k in batch]) - z_t[bt]) ** 2).sum() / w.sum()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(trainable + head, self.clip_grad)
                optimizer.step()
                schedule.step()
                running += float(loss.detach()) * float(w.sum())
                seen += float(w.sum())
            self.loss_history_.append(running / seen)

    def predict_log(self, prompts: Sequence[str]) -> np.ndarray:
        """Predicted ``log1p(length)`` per prompt (float64)."""
        import torch

        if self._head is None:
            raise ValueError("LMLengthPredictor is not fitted: call fit(prompts, lengths) first")
        prompts = _check_prompts(prompts)
        out = np.empty(len(prompts))
        if not prompts:
            return out
        with self._threads(), torch.no_grad():
            rows = self._encode(prompts)
            sizes = np.array([len(r) for r in rows])
            for batch in self._batches(np.argsort(sizes, kind="stable"), sizes, self.predict_batch_size, None):
                out[batch] = self._forward([rows[k] for k in batch]).double().cpu().numpy()
        return self._mu + self._sd * out

    def predict(self, prompts: Sequence[str]) -> np.ndarray:
        return np.expm1(np.clip(self.predict_log(prompts), 0.0, 50.0))

    # ------------------------------------------------------------------ save / load
    def save(self, path: str | Path) -> Path:
        """Write the fitted predictor to the directory ``path``, atomically (built beside it,
        then renamed): ``meta.json`` (settings, target scaling, the backbone it was trained on),
        ``trained.safetensors`` (the backbone tensors ``fit`` trained, and no others) and
        ``head.safetensors``. The frozen rest is read from the backbone at load."""
        from .predictor_files import write_predictor_dir

        if self._head is None:
            raise ValueError("LMLengthPredictor is not fitted: nothing to save")

        def tensors(tmp: Path) -> None:
            from safetensors.torch import save_file

            state = self._backbone.state_dict()
            save_file({k: state[k].detach().cpu().contiguous() for k in sorted(self._trained)},
                      str(tmp / "trained.safetensors"))
            save_file({"weight": self._head.weight.detach().float().cpu().contiguous(),
                       "bias": self._head.bias.detach().float().cpu().contiguous()}, str(tmp / "head.safetensors"))

        meta = {"kind": "lm", "pooling": self.pooling, "mu": self._mu, "sd": self._sd,
                "hidden_size": int(self._backbone.config.hidden_size), "max_prompt_tokens": self.max_prompt_tokens,
                "dtype": self.dtype, "base_model": self.model_path.name, "fit_seconds": self.fit_seconds_,
                "backbone_path": str(self.model_path.resolve()), "train_layers": self.train_layers,
                "loss_history": self.loss_history_, "num_parameters": self.num_parameters_}
        return write_predictor_dir(path, meta, tensors)

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu", num_threads: int = 0,
             predict_batch_size: int = 64) -> "LMLengthPredictor":
        """The predictor :meth:`save` wrote: the backbone it names, with the trained tensors
        put back (a directory from before, with a whole ``backbone/``, loads too); a directory
        that does not fit (missing files, a backbone that is gone, a head whose width is not
        the backbone's) raises ``PredictorFileError``."""
        import torch

        from .predictor_files import PredictorFileError, read_predictor_meta

        path = Path(path)
        meta = read_predictor_meta(path, "lm")
        whole = (path / "backbone" / "config.json").is_file()
        backbone = path / "backbone" if whole else Path(str(meta.get("backbone_path", "")))
        for need in ("head.safetensors",) + (() if whole else ("trained.safetensors",)):
            if not (path / need).is_file():
                raise PredictorFileError(f"{path}: saved lm predictor without {need}")
        if not (backbone / "config.json").is_file():
            raise PredictorFileError(f"{path}: the backbone it was trained on, {str(backbone)!r}, is not there "
                                     "(meta.json backbone_path); restore it, or fit the predictor again")
        try:
            out = cls(model_path=backbone, pooling=meta["pooling"], max_prompt_tokens=meta["max_prompt_tokens"],
                      device=device, dtype=meta["dtype"], num_threads=num_threads,
                      predict_batch_size=predict_batch_size, train_layers=meta.get("train_layers"))
            mu, sd, hidden = float(meta["mu"]), float(meta["sd"]), int(meta["hidden_size"])
        except (KeyError, TypeError, ValueError) as error:
            raise PredictorFileError(f"{path / 'meta.json'}: not an lm predictor ({error!r})") from None
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            head = load_file(str(path / "head.safetensors"))
        except (SafetensorError, OSError) as error:
            raise PredictorFileError(f"{path / 'head.safetensors'}: unreadable ({error})") from None
        with out._threads():
            out._backbone, out._tokenizer = out._load()
        if not whole:
            put_back_trained(out._backbone, path / "trained.safetensors")
        out._trained = trained_names(out._backbone, out.train_layers)
        width = int(out._backbone.config.hidden_size)
        if width != hidden or set(head) != {"weight", "bias"} or tuple(head["weight"].shape) != (1, width) \
                or tuple(head["bias"].shape) != (1,):
            shapes = {k: tuple(v.shape) for k, v in head.items()}
            raise PredictorFileError(
                f"{path}: the head {shapes} does not fit the backbone (hidden size {width}, meta.json says {hidden})")
        device_ = next(out._backbone.parameters()).device
        out._head = torch.nn.Linear(width, 1).to(device_)
        with torch.no_grad():
            out._head.weight.copy_(head["weight"])
            out._head.bias.copy_(head["bias"])
        out._backbone.eval()
        out._head.eval()
        out._mu, out._sd = mu, sd
        out.fit_seconds_ = float(meta.get("fit_seconds", float("nan")))
        out.loss_history_ = list(meta.get("loss_history", []))
        out.num_parameters_ = int(meta.get("num_parameters", 0))
        return out


def trained_names(backbone, train_layers: int | None) -> set[str]:
    """The backbone parameters ``fit`` trains: those of the top ``train_layers`` decoder
    layers (``...layers.<i>.``) and every parameter outside the layers but the embeddings
    (the final norm); all of them when ``train_layers`` is None or covers every layer, or
    when the backbone names no ``layers.<i>`` (another architecture's naming)."""
    import re

    names = [n for n, _ in backbone.named_parameters()]
    index = {n: int(m.group(1)) for n in names if (m := re.search(r"(?:^|\.)layers\.(\d+)\.", n))}
    if train_layers is None or not index:
        return set(names)
    first = max(index.values()) + 1 - train_layers
    return {n for n in names if (index[n] >= first if n in index else "embed" not in n)}


def put_back_trained(backbone, file: Path) -> None:
    """Load the tensors a saved predictor trained into the fresh ``backbone``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .predictor_files import PredictorFileError

    try:
        trained = load_file(str(file))
    except (SafetensorError, OSError) as error:
        raise PredictorFileError(f"{file}: unreadable ({error})") from None
    unknown = sorted(set(trained) - set(backbone.state_dict()))
    if unknown:
        raise PredictorFileError(f"{file}: tensors the backbone does not have (first: {unknown[0]!r}); it was "
                                 "trained on another model")
    backbone.load_state_dict(trained, strict=False)
