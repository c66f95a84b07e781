"""The constructor both search envs share (:class:`SearchEnv`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mas_envs.core import TextAECEnv

from .common import NotesAfterActionMixin, SearchMetricsMixin, check_retriever_arg
from .prompts import check_prompt_style
from .retriever import Retriever

__all__ = ["SearchEnv"]


class SearchEnv(SearchMetricsMixin, NotesAfterActionMixin, TextAECEnv):
    """Base of search-1agent and search-3agent: their shared arguments, checked and kept.

    Args:
        retriever: anything :func:`~mas_envs.envs.search.common.resolve_retriever` accepts (resolved on the
            first search).
        topk: passages per search (>= 1).
        prompt_style: one of :data:`~mas_envs.envs.search.prompts.PROMPT_STYLES`.
        max_turns: the base env's cap on agent actions (``None``: the env counts its turns itself).
        tasks, invalid_action_penalty, render_mode: :class:`~mas_envs.core.TextAECEnv`'s.

    Raises:
        ValueError: ``topk < 1``, an unknown prompt style, or a retriever argument of the wrong form.
    """

    def __init__(
        self,
        *,
        retriever: Retriever | str | Sequence[str] | None,
        topk: int,
        prompt_style: str,
        max_turns: int | None,
        tasks: Sequence[dict[str, Any]] | str | None,
        invalid_action_penalty: float | None,
        render_mode: str | None,
    ) -> None:
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        check_retriever_arg(retriever)
        self.prompt_style = check_prompt_style(prompt_style)
        super().__init__(
            tasks=tasks,
            invalid_action_penalty=invalid_action_penalty,
            max_turns=max_turns,
            render_mode=render_mode,
        )
        self.retriever = retriever
        self.topk = topk
