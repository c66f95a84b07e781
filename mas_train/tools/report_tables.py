"""The summary tables of a run page (:mod:`mas_train.tools.report`): its settings, first vs last evaluation and
each agent's diversity, from the run's logged lines. A game's (:mod:`mas_envs.games`) tables lead with its exact
measure instead of a team outcome.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# The metrics of the summary tables, in this order (then every other eval/ key the run logged).
_TRAIN_KEYS = ("charts/reward", "charts/success_rate", "charts/invalid_rate", "charts/turns")
_SKIP_EVAL = ("eval/seconds",)
# A game (mas_envs.games: per-seat win/draw/loss metrics) has no team outcome: its episodes all "succeed" (the game
# ended by its rules) and its team reward is 0 when zero-sum, so avg@k, pass@k, reward and success rate are left out
# of its summary; its exact measure (``exploitability``, ``game_value``) and per-seat results lead instead.
_TEAM_ONLY = ("avg@", "pass@", "reward", "success_rate")


def is_game(line: Mapping[str, object]) -> bool:
    """Whether a logged line is a game's: it has a seat's ``env/<seat>/win`` metric."""
    return any(k.startswith(("eval/env/", "env/")) and k.endswith("/win") for k in line)


def team_only(key: str) -> bool:
    """Whether a metric (without its ``eval/`` or ``charts/`` prefix) is a team task's outcome (`_TEAM_ONLY`)."""
    return key.rsplit("/", 1)[-1].startswith(_TEAM_ONLY)


def fmt(v: object) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int | float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.3e}"
    return str(v)


def eval_rows(first: Mapping[str, object], last: Mapping[str, object]) -> list[dict[str, str]]:
    """Rows ``metric | first | last | change`` over the eval keys either line has."""
    keys = [k for k in dict.fromkeys([*first, *last]) if k.startswith("eval/") and k not in _SKIP_EVAL]
    game = is_game(first) or is_game(last)
    if game:
        keys = [k for k in keys if not team_only(k[5:])]
    head = (
        ("exploitability", "game_value") if game else ("avg@", "pass@", "reward", "invalid_rate", "num_tasks")
    )

    def order(k: str) -> tuple[int, int, str]:
        rest = k[5:]
        lead = next((i for i, h in enumerate(head) if rest.startswith(h)), len(head))
        if "/" not in rest or (game and lead < len(head)):
            return (0, lead, rest)
        return (2, 0, rest) if rest.startswith(("env/", "invalid_rate/")) else (1, 0, rest)

    rows = []
    for k in sorted(keys, key=order):
        a, b = first.get(k), last.get(k)
        change = ""
        if isinstance(a, int | float) and isinstance(b, int | float):
            change = f"{b - a:+.4g}" if b != a else "0"
        rows.append({"metric": k[5:], "first": fmt(a), "last": fmt(b), "change": change})
    return rows


def settings_rows(saved: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The settings table of a run page from its ``config.yaml`` as read (plain YAML data, not a
    :class:`~mas_train.config.TrainConfig`: the page shows runs of older versions too)."""
    groups = saved.get("model_groups") or {}
    models = ", ".join(f"{g}: {v.get('model') or saved.get('model')}" for g, v in groups.items()) or str(
        saved.get("model")
    )
    lora = saved.get("lora")
    rows = [
        (
            "env",
            f"{saved.get('env')} {json.dumps(saved['env_kwargs'])}"
            if saved.get("env_kwargs")
            else str(saved.get("env")),
        ),
        ("model", models),
        ("model sharing", str(saved.get("model_sharing"))),
        ("LoRA", f"r={lora.get('r')}, alpha={lora.get('alpha')}" if isinstance(lora, Mapping) else "off"),
        ("advantage", f"{saved.get('advantage_mode')} (scope {saved.get('advantage_scope')})"),
        (
            "batch",
            f"{saved.get('tasks_per_step')} tasks × G={saved.get('num_generations')} per step, "
            f"max_steps {saved.get('max_steps')}, lr {saved.get('learning_rate')}",
        ),
        ("train data", str(saved.get("train_data") or "the env default")),
        (
            "eval",
            f"{saved.get('eval_data') or 'the env default'}: {saved.get('eval_num_tasks') or 'all'} tasks × "
            f"k={saved.get('eval_k')}, every {saved.get('eval_steps')} steps",
        ),
        ("seed", str(saved.get("seed"))),
    ]
    return rows


def diversity_rows(first: Mapping[str, object], last: Mapping[str, object]) -> list[dict[str, str]]:
    """Rows ``agent | what | first | last`` of the ``diversity/distinct…/<agent>`` keys either line has
    (:func:`mas_train.metrics.diversity_metrics`): distinct first turns, then distinct final answers."""
    kinds = (("distinct", "first turns (completions)"), ("distinct_answers", "final answers (parsed)"))
    agents = [
        k.split("/", 2)[2] for k in dict.fromkeys([*first, *last]) if k.startswith("diversity/distinct/")
    ]
    rows = []
    for a in dict.fromkeys(agents):
        for kind, what in kinds:
            key = f"diversity/{kind}/{a}"
            if key in first or key in last:
                rows.append(
                    {"agent": a, "what": what, "first": fmt(first.get(key)), "last": fmt(last.get(key))}
                )
    return rows


def train_rows(t0: Mapping[str, object], t1: Mapping[str, object], *, game: bool) -> list[dict[str, str]]:
    """Rows ``metric | first | last`` of the first and last training step's `_TRAIN_KEYS` (a game's without
    its team outcome: :func:`team_only`)."""
    return [
        {"metric": k[7:], "first": fmt(t0.get(k)), "last": fmt(t1.get(k))}
        for k in _TRAIN_KEYS
        if k in t1 and not (game and team_only(k[7:]))
    ]
