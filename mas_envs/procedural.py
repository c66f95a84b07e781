"""Procedural task sources: reasoning-gym generators as task sets, and their own answer scorers.

A reasoning-gym spec names a generator and its parameters in one string, usable wherever a bundled set
name or a file is (`load_tasks`, `train_data`, `eval_data`, `mas-eval --data`, an env's `tasks=`)::

    rg:<generator>?<param>=<value>&<param>=<value>...
    rg:basic_arithmetic?size=500&seed=1&min_terms=2&max_terms=2&min_digits=1&max_digits=2&operators=+,-

* `<generator>` is a reasoning-gym dataset name (`reasoning_gym.factory.DATASETS`: `basic_arithmetic`,
  `chain_sum`, `letter_jumble`, ...).
* Parameters are the generator's config fields, passed through unchanged; each value is converted to the
  type of the field's default (`int`, `float`, `bool` as `true`/`false`/`1`/`0`, a list or tuple as
  comma-separated items, else `str`). Values are percent-decoded, and `+` stays a plus sign (it is not a
  space here), so `operators=+,-` works.
* `size` (default 500) and `seed` (default 0) are reasoning-gym's own; the same spec always gives the same
  rows. Train and eval sets of one generator differ by seed; `mas_envs.data.drop_overlap` removes the
  questions they still share (small generators repeat questions across seeds).

Each row is ``{"question", "answer", "id", "data_source", "grader", "reasoning_gym"}``: `id` is
``rg/<generator>/<seed>/<index>``, `data_source` is ``reasoning_gym/<generator>`` (so avg@k is reported per
generator), `grader` is ``"math"`` when the gold answer is a number (graded by
`mas_envs.rewards.grade_math`, like every math set) and ``"reasoning_gym"`` otherwise (word tasks, graded by
the generator's own `score_answer`, see `score_with_generator`), and `reasoning_gym` holds what that scorer
needs: ``{"name", "params", "metadata"}``, all plain data, so rows pickle and serialise.

`reasoning_gym` is an optional dependency (the `tasks` extra, included in `train`): it is imported only
when a spec is loaded or a word task is graded (its import takes ~1 s and pulls in matplotlib).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import typing
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

__all__ = ["RG_PREFIX", "is_rg_spec", "load_rg_tasks", "parse_rg_spec", "score_with_generator"]

RG_PREFIX = "rg:"
DEFAULT_SIZE = 500
DEFAULT_SEED = 0

# A gold answer that grade_math handles: an integer, a decimal or a fraction of integers.
_NUMERIC_RE = re.compile(r"^\s*[-+]?(\d+(\.\d*)?|\.\d+)(\s*/\s*\d+)?\s*$")


def is_rg_spec(source: object) -> bool:
    """Whether `source` is a reasoning-gym spec (a string starting with ``rg:``)."""
    return isinstance(source, str) and source.startswith(RG_PREFIX)


def _rg():
    try:
        import reasoning_gym
    except ImportError as err:  # pragma: no cover - the extra is installed in the dev environment
        raise ImportError(
            "rg: task specs need reasoning-gym: pip install 'mas-rl[tasks]' (or reasoning-gym==0.1.25)"
        ) from err
    return reasoning_gym


def _config_fields(name: str) -> dict[str, dataclasses.Field]:
    _rg()
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        raise ValueError(
            f"unknown reasoning-gym generator {name!r} in an rg: spec; known: {', '.join(sorted(DATASETS))}"
        )
    return {f.name: f for f in dataclasses.fields(DATASETS[name][1])}


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _convert(name: str, key: str, raw: str, f: dataclasses.Field) -> Any:
    default = _field_default(f)
    origin = typing.get_origin(f.type) if not isinstance(f.type, str) else None
    try:
        if isinstance(default, bool):
            low = raw.lower()
            if low not in ("true", "false", "1", "0"):
                raise ValueError(f"expected true/false, got {raw!r}")
            return low in ("true", "1")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, (list, tuple)) or origin in (list, tuple):
            words = [x.strip() for x in raw.split(",") if x.strip()]
            items: list[Any] = words
            sample = default[0] if default else None
            if isinstance(sample, bool):
                items = [x.lower() in ("true", "1") for x in words]
            elif isinstance(sample, int):
                items = [int(x) for x in words]
            elif isinstance(sample, float):
                items = [float(x) for x in words]
            return tuple(items) if isinstance(default, tuple) else list(items)
        if default is None and raw.lstrip("-").isdigit():
            return int(raw)  # Optional[int] fields such as seed
    except ValueError as err:
        raise ValueError(f"rg:{name}: bad value for {key}: {err}") from None
    return raw


def parse_rg_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split an ``rg:`` spec into ``(generator name, params)`` with values typed by the generator's config.

    `size` and `seed` are always in the result (defaults 500 and 0).

    Raises:
        ValueError: not an ``rg:`` spec, an unknown generator, an unknown parameter (the message lists the
            generator's parameters), a repeated parameter or a value of the wrong type.
        ImportError: reasoning-gym is not installed.
    """
    if not is_rg_spec(spec):
        raise ValueError(f"not a reasoning-gym spec (must start with {RG_PREFIX!r}): {spec!r}")
    body = spec[len(RG_PREFIX) :]
    name, _, query = body.partition("?")
    name = name.strip()
    if not name:
        raise ValueError(f"{spec!r}: name a generator, e.g. rg:basic_arithmetic?seed=1")
    fields = _config_fields(name)
    params: dict[str, Any] = {}
    for part in filter(None, query.split("&")):
        key, eq, raw = part.partition("=")
        key = unquote(key).strip()
        if not eq:
            raise ValueError(f"{spec!r}: parameter {key!r} has no value (write {key}=...)")
        if key not in fields:
            raise ValueError(
                f"{spec!r}: {name} has no parameter {key!r}; its parameters: {', '.join(sorted(fields))}"
            )
        if key in params:
            raise ValueError(f"{spec!r}: parameter {key!r} given twice")
        params[key] = _convert(name, key, unquote(raw), fields[key])
    params.setdefault("size", DEFAULT_SIZE)
    params.setdefault("seed", DEFAULT_SEED)
    return name, params


@functools.lru_cache(maxsize=32)
def _dataset(name: str, params_json: str):
    params = json.loads(params_json)
    fields = _config_fields(name)
    for k, v in params.items():  # JSON turned tuples into lists; the config may want tuples back
        if isinstance(v, list) and isinstance(_field_default(fields[k]), tuple):
            params[k] = tuple(v)
    try:
        return _rg().create_dataset(name, **params)
    except (TypeError, AssertionError, ValueError) as err:
        raise ValueError(f"rg:{name}: reasoning-gym refused the parameters {params}: {err}") from err


def _params_json(params: Mapping[str, Any]) -> str:
    return json.dumps(dict(params), sort_keys=True, default=list)


def load_rg_tasks(spec: str) -> list[dict[str, Any]]:
    """The task rows of a reasoning-gym spec (see the module docstring for the row schema).

    Raises:
        ValueError, ImportError: as `parse_rg_spec`; `ValueError` also when the generator rejects the
            parameters (e.g. `min_digits > max_digits`).
    """
    name, params = parse_rg_spec(spec)
    pj = _params_json(params)
    ds = _dataset(name, pj)
    plain = json.loads(pj)
    rows = []
    for i in range(len(ds)):
        entry = ds[i]
        answer = str(entry["answer"])
        rows.append(
            {
                "question": entry["question"],
                "answer": answer,
                "id": f"rg/{name}/{params['seed']}/{i}",
                "data_source": f"reasoning_gym/{name}",
                "grader": "math" if _NUMERIC_RE.match(answer) else "reasoning_gym",
                "reasoning_gym": {
                    "name": name,
                    "params": plain,
                    "metadata": json.loads(json.dumps(entry.get("metadata", {}), default=list)),
                },
            }
        )
    return rows


def score_with_generator(answer: str | None, task: Mapping[str, Any]) -> float:
    """The generator's own `score_answer(answer, entry)` for a reasoning-gym row, in [0, 1].

    `answer` is the extracted final answer (e.g. the `\\boxed{}` content), `None` when there is none
    (scores 0). The scorer is the one of the generator that made the row (rebuilt from the row's
    `reasoning_gym` field, cached per process). Never raises on any answer text: a scorer error scores 0.

    Raises:
        KeyError: `task` has no `reasoning_gym` field (it was not made by `load_rg_tasks`).
    """
    info = task["reasoning_gym"]
    if answer is None:
        return 0.0
    ds = _dataset(info["name"], _params_json(info["params"]))
    entry = {"question": task["question"], "answer": task["answer"], "metadata": info.get("metadata", {})}
    try:
        return float(ds.score_answer(answer, entry))
    except Exception:  # a generator's scorer failing on odd text is a wrong answer, not a crash
        return 0.0
