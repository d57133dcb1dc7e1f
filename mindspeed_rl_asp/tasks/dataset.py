"""``task=dataset``: prompts from a user's jsonl or parquet file, read with ``datasets``, or
from a preprocessed (Megatron indexed) dataset: ``task.path`` a prefix with
``<prefix>_packed_<field>_document.bin`` / ``.idx`` files (MindSpeed-RL's ``data_path``;
tasks/megatron_data.py reads them, decoded to text with the model's tokenizer).

Each row gives a prompt (``task.prompt_key``: a string, or a list of chat messages
``{"role", "content"}``), optionally a reference answer (``task.answer_key``), an id
(``task.id_key``; default ``row-<index in the file>``), a group for per-group evaluation
rates (``task.group_key``) and a reference response whose token count the planner may use
(``task.reference_key``). The model tokenizer's chat template is applied when it has one
(``task.chat_template=auto``; ``always`` refuses a tokenizer without one, ``never`` sends
the text as it is). A prompt longer than ``rl.max_prompt_length`` tokens is skipped and
counted (``task.filter_overlong_prompts=true``) or refused; it is never truncated.

Every problem with the file or a row raises :class:`~mindspeed_rl_asp.tasks.base.TaskError`
naming the key, the file and the row.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from .base import TaskError, TaskPrompt, fit_prompt_lengths

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
CHAT_TEMPLATE_MODES = ("auto", "always", "never")


def read_rows(path: str, key: str = "task.path", tokenizer=None):
    """The rows of a jsonl / parquet file as a ``datasets.Dataset``, or of a preprocessed
    dataset prefix (decoded with ``tokenizer``), one clear error if the file is missing,
    empty, unreadable or has no rows."""
    from . import megatron_data

    file = Path(path)
    if not path:
        raise TaskError(f"{key} is empty: task=dataset reads its prompts from a .jsonl or .parquet file; "
                        f"set {key}=FILE")
    if not file.is_file() and file.suffix.lower() not in FORMATS:
        if not megatron_data.is_packed(path):
            raise TaskError(megatron_data.missing_message(path, key))
        return megatron_data.Rows(megatron_data.packed_rows(path, tokenizer, key))
    if not file.is_file():
        raise TaskError(f"{key}={path!r}: no such file")
    builder = FORMATS.get(file.suffix.lower())
    if builder is None:
        raise TaskError(f"{key}={path!r}: unknown file type {file.suffix!r}; use one of {', '.join(FORMATS)}")
    if file.stat().st_size == 0 or (builder == "json" and _only_whitespace(file)):
        raise TaskError(f"{key}={path!r}: the file is empty" + (" (blank lines only)" if file.stat().st_size else ""))
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        rows = datasets.load_dataset(builder, data_files=str(file.resolve()), split="train")
    except Exception as error:  # datasets raises many kinds; each is a file the user must fix
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise TaskError(f"{key}={path!r}: cannot be read as {builder} ({detail})") from None
    if len(rows) == 0:
        raise TaskError(f"{key}={path!r}: the file has no rows")
    return rows


def _only_whitespace(file: Path, chunk: int = 1 << 16) -> bool:
    """True when a text file holds nothing but whitespace (``datasets`` then reports "no
    data" for its split, which does not say what is wrong with the file)."""
    with file.open("rb") as handle:
        while block := handle.read(chunk):
            if block.strip():
                return False
    return True


def _check_fields(rows, path: str, keys: dict[str, str]) -> None:
    fields = list(rows.column_names)
    for key, field in keys.items():
        if field and field not in fields:
            raise TaskError(f"{key}={field!r}: {path} has no such field; its fields are {', '.join(fields)}")


def _messages(value, system_prompt: str, where: str) -> tuple[list[dict], str]:
    """Chat messages for a prompt field value, and the question text rewards read."""
    if isinstance(value, str):
        if not value.strip():
            raise TaskError(f"{where}: the prompt is empty")
        messages = [{"role": "user", "content": value}]
        question = value
    elif isinstance(value, list) and value and all(isinstance(m, dict) and "content" in m for m in value):
        messages = [{"role": m.get("role", "user"), "content": m["content"]} for m in value]
        users = [m["content"] for m in messages if m["role"] == "user"]
        question = users[-1] if users else messages[-1]["content"]
    else:
        raise TaskError(f"{where}: the prompt must be a string or a list of {{role, content}} messages, "
                        f"got {type(value).__name__}")
    if system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system_prompt}] + messages
    return messages, question


def _render(messages: list[dict], tokenizer, use_template: bool, where: str) -> str:
    if use_template:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if len(messages) > 1 and any(m["role"] != "system" for m in messages[:-1]):
        raise TaskError(f"{where}: a conversation of {len(messages)} messages needs a chat template, and "
                        "task.chat_template=never (or the tokenizer has none)")
    return "\n\n".join(m["content"] for m in messages)


def load_prompts(task_cfg, tokenizer, max_prompt_length: Optional[int], path: str, key: str = "task.path",
                 limit: int = 0, needs_answer: bool = False) -> tuple[list[TaskPrompt], list[str]]:
    """The prompts of the file at ``path`` (config key ``key``): ``(kept, skipped ids)``.
    ``limit > 0`` keeps the first ``limit`` rows that fit."""
    rows = read_rows(path, key, tokenizer)
    keys = {"task.prompt_key": task_cfg.prompt_key, "task.answer_key": task_cfg.answer_key,
            "task.id_key": task_cfg.id_key, "task.group_key": task_cfg.group_key,
            "task.reference_key": task_cfg.reference_key}
    if not task_cfg.prompt_key:
        raise TaskError("task.prompt_key is empty: name the field that holds the prompt")
    _check_fields(rows, path, keys)
    if needs_answer and not task_cfg.answer_key:
        raise TaskError("the rewards of task.verifier_function compare with a reference answer: set "
                        "task.answer_key to the field that holds it")
    # A preprocessed dataset's input_ids hold the prompt with the template applied already.
    use_template = _use_chat_template(task_cfg.chat_template, tokenizer) and not isinstance(rows, list)
    prompts, seen = [], {}
    for index, row in enumerate(rows):
        prompts.append(_row_prompt(task_cfg, row, f"row {index} of {path}", _row_id(task_cfg, row, index, path, seen),
                                   tokenizer, use_template, needs_answer))
    lengths = [len(ids) for ids in _ids(tokenizer, [p.prompt for p in prompts])]
    kept, skipped = fit_prompt_lengths(prompts, lengths, max_prompt_length, task_cfg.filter_overlong_prompts,
                                       lambda i: f"row {i} of {path} (id {prompts[i].id!r})")
    return (kept[:limit] if limit > 0 else kept), skipped


def _use_chat_template(mode: str, tokenizer) -> bool:
    """Whether prompts go through the tokenizer's chat template (``task.chat_template``)."""
    if mode not in CHAT_TEMPLATE_MODES:
        raise TaskError(f"task.chat_template={mode!r} is not one of {', '.join(CHAT_TEMPLATE_MODES)}")
    if tokenizer is None:
        raise TaskError("task=dataset needs the model's tokenizer (to apply its chat template and measure prompts)")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if mode == "always" and not has_template:
        raise TaskError("task.chat_template=always, but the tokenizer at model.path has no chat template; "
                        "use task.chat_template=auto or never")
    return has_template and mode != "never"


def _row_id(task_cfg, row, index: int, path: str, seen: dict) -> str:
    """The row's prompt id (``task.id_key``, else ``row-<index>``), unique in the file;
    ``seen`` (id -> row) is updated."""
    where = f"row {index} of {path}"
    if task_cfg.id_key:
        if row[task_cfg.id_key] is None:
            raise TaskError(f"{where}: task.id_key={task_cfg.id_key!r} is empty")
        prompt_id = str(row[task_cfg.id_key])
    else:
        prompt_id = f"row-{index}"
    if prompt_id in seen:
        raise TaskError(f"{where}: id {prompt_id!r} (task.id_key={task_cfg.id_key!r}) is also the id of row "
                        f"{seen[prompt_id]}; ids must be unique")
    if "@e" in prompt_id:
        raise TaskError(f"{where}: id {prompt_id!r} contains '@e', which marks epochs; use other ids")
    seen[prompt_id] = index
    return prompt_id


def _row_prompt(task_cfg, row, where: str, prompt_id: str, tokenizer, use_template: bool,
                needs_answer: bool) -> TaskPrompt:
    """One row as a prompt: its rendered text, question, answer, group and reference length."""
    if row[task_cfg.prompt_key] is None:  # the field is in other rows (datasets fills the gap with null)
        raise TaskError(f"{where}: task.prompt_key={task_cfg.prompt_key!r} is missing or null in this row")
    messages, question = _messages(row[task_cfg.prompt_key], task_cfg.system_prompt, where)
    answer = None
    if task_cfg.answer_key:
        value = row[task_cfg.answer_key]
        if value is None and needs_answer:
            raise TaskError(f"{where}: task.answer_key={task_cfg.answer_key!r} is empty, and the rewards "
                            "need a reference answer")
        answer = None if value is None else str(value)
    reference = row[task_cfg.reference_key] if task_cfg.reference_key else None
    if task_cfg.reference_key and not isinstance(reference, str):
        raise TaskError(f"{where}: task.reference_key={task_cfg.reference_key!r} must hold a reference "
                        f"response (a string), got {type(reference).__name__}")
    return TaskPrompt(
        id=prompt_id, prompt=_render(messages, tokenizer, use_template, where), question=question, answer=answer,
        metadata=dict(row), group=str(row[task_cfg.group_key]) if task_cfg.group_key else "all",
        reference_length=(float(len(_ids(tokenizer, reference)) + 1) if reference is not None else None))


def _ids(tokenizer, text):
    """Token ids of ``text`` (a string or a list of them), as the runtime tokenizes prompts."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def check_maze_rows(prompts: Sequence[TaskPrompt], path: str) -> None:
    """Every question holds a maze the maze rewards can read (checked before training)."""
    from .maze import MazeFormatError, parse_maze

    for prompt in prompts:
        try:
            parse_maze(prompt.question)
        except MazeFormatError as error:
            raise TaskError(f"prompt {prompt.id!r} of {path}: a maze reward is configured but its prompt holds "
                            f"no readable maze: {error}") from None
