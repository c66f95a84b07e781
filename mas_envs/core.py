"""Text AEC base class: the PettingZoo bookkeeping every `mas_envs` environment shares.

A `TextAECEnv` is a PettingZoo `AECEnv` whose observations are prompt strings and whose actions are the raw
text an agent (an LLM) produced. The base class does all the bookkeeping that is easy to get wrong, so an
environment only describes its task logic.

What the base class does
------------------------
* `reset(seed, options)`: picks the task from `options["task"]` (a row dict), `options["task_index"]`
  (an index into the env's own task list) or the seed (a fresh `numpy.random.Generator`, never the global
  RNG; no seed continues the env's own generator, as in Gymnasium). Unknown option keys are ignored.
* `step(action)`: dead steps (`None` for a terminated/truncated agent, PettingZoo's `_was_dead_step`),
  `rewards` / `_cumulative_rewards`, the invalid-action penalty `-c` to the acting agent, the team reward
  `R` to every agent when the episode ends, `terminations` (the env's logic ended the episode) and
  `truncations` (the `max_turns` cap), the global turn counter, and `infos`.
* `infos[agent]` always holds `messages` (that agent's prompt as chat messages), `turn` (0-based index of the
  next turn, global across agents), `task_id` and `invalid_action` (whether the agent's last action was
  malformed) and `parsed_answer` (the answer the env parsed from the agent's last action, `Transition.answer`;
  `None` before it acted, when the action gives none, or when the env declares none). When the episode ends
  every agent also gets `team_reward` (R, no penalties), `success` and
  `episode_metrics` (the env's per-episode metrics from `Outcome.metrics`, name -> float), `role_rewards`
  (the env's per-turn role scores from `Outcome.role_rewards`, turn -> float; empty for an env that gives none)
  and `agent_rewards` (each agent's outcome reward, agent -> float: R for every agent in a team env, the env's
  `Outcome.agent_rewards` in an env with `per_agent_rewards = True`, such as a zero-sum game).
* One cached `UnicodeText` space per agent for observations and actions: any Unicode string, empty allowed.
* `render()` with `render_mode="ansi"` returns the transcript; `state()` returns it too.
* Pickling: envs hold only plain data, so `pickle.dumps(env)` works at any point (tested after reset).

Writing an environment: the subclass hooks
------------------------------------------
A subclass sets these class attributes (the typed block, as in PettingZoo's ``utils/env.py``)::

    metadata: dict[str, Any]                       # {"name": "my-env-v0", "render_modes": ["ansi"],
                                                   #  "is_parallelizable": False}
    possible_agents: tuple[str, ...]               # e.g. ("solver", "verifier")
    stop_strings: dict[str, tuple[str, ...]]       # per agent, strings after which generation must stop
    default_invalid_action_penalty: float          # the coefficient c (the invalid_action_penalty= kwarg wins)
    default_tasks: str | None                      # task spec of the env's own (training) task list
    default_eval_tasks: str | None                 # task spec of its held-out evaluation set
    role_reward_agents: tuple[str, ...]            # optional: agents whose turns get a role score (default none)
    fuzz_fragments: dict[str, tuple[str, ...]]     # optional: tags UnicodeText.sample() mixes into random text
    per_agent_rewards: bool                        # optional: True when each agent gets its own outcome reward
                                                   #  (Outcome.agent_rewards, e.g. a zero-sum game), not R
    eval_plays_train_tasks: bool                   # optional: True when the tasks are starting positions (a game's
                                                   #  deals): with no eval set, evaluation plays the env's own tasks

A task spec is anything `mas_envs.data.load_tasks` accepts: a bundled set name, a path, a hub id or a
reasoning-gym spec (``rg:basic_arithmetic?seed=1``). `default_tasks` is loaded lazily on the first reset that
needs the env's own task list. `eval_task_source()` (a classmethod) is the one place trainers and `mas-eval`
read the default evaluation set from: `default_eval_tasks`, else the bundled ``-test`` twin of a bundled
``-train`` `default_tasks`, else `None` (then the caller must be given an eval set, unless the env sets
`eval_plays_train_tasks`: its tasks are starting positions, such as a game's deals, with nothing to hold out, and
evaluation then plays the env's own task list, which training also uses).

and implements these public hooks (all called by the base class; none of them touches rewards or dones):

* `start_episode(self, task: dict) -> str`: set up episode state for `task` and return the first agent to act.
* `prompt_messages(self, agent: str) -> list[dict[str, str]]`: that agent's prompt now, as chat messages.
* `apply_action(self, agent: str, action: str) -> Transition`: parse the action, update the episode state and
  say whether it was invalid and who acts next (`next_agent=None` ends the episode), and optionally the
  answer it parsed from the action (`Transition.answer`, default `None`: trainers use it for per-agent answer
  diversity). It must not raise on any str.
* `episode_outcome(self) -> Outcome`: the team reward R, success, optional per-episode metrics and optional
  per-turn role scores (`Outcome.role_rewards`, only for turns of the agents in `role_reward_agents`), called
  once when the episode ends.
* optionally call `add_note(text)` to add an env message (such as retrieved passages) to the transcript, and
  define the classmethods `golden_episodes()` (`GoldenEpisode`s that `mas_envs.testing.check_env` replays)
  and `conformance_kwargs()` (constructor kwargs for those checks, e.g. a stub retriever); override
  `startup_warnings()` to tell the user, before training starts, about a problem that need not stop it (the
  search envs warn when their retrieval server does not answer).
* optionally override `exact_evaluation(score) -> ExactEvaluation | None` to compute evaluation metrics from the
  agents' log-probabilities of given replies (`score`, a `Scorer`) rather than from sampled episodes (Kuhn
  poker's exact exploitability); trainers log its metrics as ``eval/<name>`` and write its artifacts.

What a trainer reads of an env beyond the PettingZoo API is the members above with their defaults (plus
`invalid_action_penalty`, `transcript` and `close()`), reached through `text_env(env)`.

Then give the module an `env(**kwargs)` function (`wrap(MyEnv(**kwargs))`) and register it (see
`mas_envs.registration`). `examples/custom_env.py` is a complete, runnable example.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import numbers
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.utils.wrappers import OrderEnforcingWrapper

__all__ = [
    "EnvFactory",
    "ExactEvaluation",
    "GoldenEpisode",
    "Outcome",
    "Scorer",
    "TextAECEnv",
    "Transition",
    "TextObservation",
    "UnicodeText",
    "messages_to_text",
    "text_env",
    "wrap",
]

# Characters `UnicodeText.sample` draws from: printable ASCII plus a few non-ASCII letters, CJK, an emoji and
# a combining mark, because real model output contains all of these and parsers must survive them.
_SAMPLE_CHARSET = string.printable + "éüßЖжλπ∑√≤≥×÷中文数学答案😀\u0301\u00a0"
# Large enough for any real prompt or completion; a text longer than this is outside the space.
MAX_TEXT_CHARS = 1 << 22


class UnicodeText(spaces.Text):
    """The space of all Python strings of at most `max_length` characters (any Unicode, `""` included).

    Gymnasium's `Text` only holds strings over a fixed charset and, by default, rejects `""`; model output
    needs neither restriction, so `contains` only checks the type and the length. `sample()` returns short
    random strings built from random characters and the given `fragments` (e.g. `"<verify>"`), which makes
    PettingZoo's `api_test` a fuzzer that also reaches the valid branches of a text parser.

    Args:
        max_length: longest string in the space, in characters.
        fragments: strings that `sample()` splices into its random text.
        seed: seed for `sample()`.
    """

    def __init__(
        self,
        max_length: int = MAX_TEXT_CHARS,
        *,
        fragments: Sequence[str] = (),
        seed: int | np.random.Generator | None = None,
    ) -> None:
        super().__init__(max_length, min_length=0, charset=_SAMPLE_CHARSET, seed=seed)
        self.fragments: tuple[str, ...] = tuple(fragments)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """Return a random string of up to 12 pieces, each a fragment or a run of 0–8 random characters.

        `mask` and `probability` are not supported (text has no action mask) and must be `None`.
        """
        if mask is not None or probability is not None:
            raise ValueError("UnicodeText.sample() takes no mask or probability; call sample() without them")
        rng = self.np_random
        pieces = []
        for _ in range(int(rng.integers(0, 13))):
            if self.fragments and rng.random() < 0.5:
                pieces.append(self.fragments[int(rng.integers(len(self.fragments)))])
            else:
                chars = rng.choice(self.character_list, size=int(rng.integers(0, 9)))
                pieces.append("".join(chars))
        return "".join(pieces)[: self.max_length]

    def __eq__(self, other: object, /) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.max_length == other.max_length
            and self.fragments == other.fragments
        )

    def __hash__(self) -> int:
        return hash((UnicodeText, self.max_length, self.fragments))

    def __repr__(self) -> str:
        return f"UnicodeText(max_length={self.max_length}, fragments={len(self.fragments)})"


class TextObservation(str):
    """An observation: a plain `str` (every string operation, `==`, hashing, JSON and pickling are `str`'s)
    that also carries `dtype`, NumPy's dtype of Python text, `numpy.dtype(str)`.

    `dtype` equals the `dtype` Gymnasium gives every `Text` space (`UnicodeText` included), so code that checks
    an observation against its space by dtype, as PettingZoo's `api_test` does
    (`observation_space.dtype == observation.dtype`), sees a text observation of a text space.
    """

    __slots__ = ()
    dtype: np.dtype = np.dtype(str)


@dataclass(frozen=True, slots=True)
class Transition:
    """What an agent's action did, as returned by `TextAECEnv.apply_action`.

    Attributes:
        invalid: the action was malformed (the acting agent gets the penalty `-c`).
        next_agent: who acts next; `None` ends the episode (all agents terminate).
        answer: optional: the final answer the env parsed from the action, in the normal form it compares
            answers in (e.g. a math solver's `\\boxed{}` content after `normalize_answer`), so two actions that
            give the same answer give equal strings. `None` (the default): the action gives no answer, or the
            env does not report answers. It reaches `infos[agent]["parsed_answer"]`; nothing is scored on it
            (mas-train logs how many distinct answers an agent gives per task, `diversity/distinct_answers/`).
    """

    invalid: bool
    next_agent: str | None
    answer: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """The end-of-episode result, as returned by `TextAECEnv.episode_outcome`.

    Attributes:
        team_reward: R, given to every agent (the paper's shared outcome reward; penalties not included).
        success: whether the task was solved (counts for avg@k / pass@k).
        metrics: optional per-episode env metrics, name -> float (e.g. ``{"verifier_accuracy": 1.0}``).
            They reach every agent's ``infos[agent]["episode_metrics"]`` at the end of the episode; the
            trainer logs their mean over a step's episodes as ``env/<name>`` and ``mas-eval`` as
            ``eval/env/<name>``. An episode may leave a metric out (e.g. no verifier turn happened): means are
            taken over the episodes that report it. Names use letters, digits, ``_`` and ``/``.
        role_rewards: optional agent-specific scores, ``{turn: score}``: the 0-based global turn index of an
            action (``TranscriptEntry.turn``, ``Sample.turn``) -> a finite float judging that turn by its role
            alone (e.g. was the verifier's verdict right), independent of the team reward. Only turns taken
            by an agent of the env's ``role_reward_agents`` may have one; a turn left out has none. They never
            enter ``rewards`` (the PettingZoo returns stay ``R - c * invalid``): they reach every agent's
            ``infos[agent]["role_rewards"]`` and the transcript at the end, and a trainer weighs them in per
            agent (``agents.<agent>.reward_weights`` in mas-train, docs/envs.md "Role rewards").
        agent_rewards: each agent's own outcome reward, agent -> finite float, for an env whose agents do not
            share one reward (a competitive game: the env sets ``per_agent_rewards = True`` and must then give
            one for every possible agent; a team env must leave it empty). When given, agent ``a`` receives
            ``agent_rewards[a]`` at the end instead of ``team_reward`` (penalties ``-c`` still apply), and
            ``team_reward`` is only the env's summary number (the games report the mean over seats). Every
            agent's ``infos[agent]["agent_rewards"]`` holds the dict at the end (in a team env: R for every
            agent).
    """

    team_reward: float
    success: bool
    metrics: Mapping[str, float] = field(default_factory=dict)
    role_rewards: Mapping[int, float] = field(default_factory=dict)
    agent_rewards: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TranscriptEntry:
    """One line of the episode transcript: an agent's action or an env message (`speaker == "env"`).

    ``role_reward`` is the turn's role score (`Outcome.role_rewards`), filled in when the episode ends; `None`
    for env messages, turns the env does not score by role and episodes still running.
    """

    turn: int
    speaker: str
    text: str
    invalid: bool = False
    role_reward: float | None = None


#: ``score(agent, prompts, completions) -> log-probs``: the total log-probability (natural log, the sum over
#: the completion's tokens) of each completion text as ``agent``'s reply to the matching prompt (chat messages),
#: under the policy being evaluated. See `TextAECEnv.exact_evaluation`.
Scorer: TypeAlias = Callable[[str, Sequence[Sequence[Mapping[str, str]]], Sequence[str]], list[float]]


@dataclass(frozen=True)
class ExactEvaluation:
    """What `TextAECEnv.exact_evaluation` returns.

    Attributes:
        metrics: name -> float, logged as ``eval/<name>`` beside the sampled evaluation's metrics (names use
            letters, digits, ``_`` and ``/``).
        artifacts: name -> a JSON-able value (e.g. a policy table); a trainer writes each to
            ``<run>/evals/<name>_step-<NNNNNN>.json``, ``mas-eval`` beside its ``--output`` file.
        table: the artifacts as plain text for a terminal (``mas-eval`` prints it); ``""`` for none.
    """

    metrics: Mapping[str, float]
    artifacts: Mapping[str, Any] = field(default_factory=dict)
    table: str = ""


@dataclass(frozen=True)
class GoldenEpisode:
    """A scripted episode with exact expected results, replayed by `mas_envs.testing.check_env`.

    Attributes:
        name: short description, used in failure messages.
        task: the task row passed as `reset(options={"task": task})`.
        actions: the text actions, in the order the env asks for them (dead steps are not listed).
        agents: the agent expected to act at each of those turns (same length as `actions`).
        returns: each agent's expected episode return (sum of all its rewards, penalties included).
        team_reward: expected `infos[a]["team_reward"]` at the end.
        success: expected `infos[a]["success"]` at the end.
        env_kwargs: constructor kwargs for this episode (e.g. a stub retriever).
        truncated: whether the episode is expected to end by truncation instead of termination.
        role_rewards: expected `infos[a]["role_rewards"]` at the end (turn -> role score); `None` skips the
            check (an env without role scores must then give `{}`).
    """

    name: str
    task: dict[str, Any]
    actions: tuple[str, ...]
    agents: tuple[str, ...]
    returns: dict[str, float]
    team_reward: float
    success: bool
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    truncated: bool = False
    role_rewards: dict[int, float] | None = None


def messages_to_text(messages: Sequence[Mapping[str, str]]) -> str:
    """Join chat messages into one prompt string (contents separated by a blank line, no role markers)."""
    return "\n\n".join(m["content"] for m in messages)


def task_id_of(task: Mapping[str, Any]) -> str:
    """The task's `id` field as a string, else a stable hash of its data source and question."""
    if task.get("id") is not None:
        return str(task["id"])
    key = f"{task.get('data_source', '')}\x00{task.get('question', '')}"
    return hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@functools.lru_cache(maxsize=16)
def _load_shared(source: str) -> tuple[Mapping[str, Any], ...]:
    # Many envs (G copies of every task group) name the same set: load and hold it once per process.
    from mas_envs.data import load_tasks

    return tuple(load_tasks(source))


def wrap(env: TextAECEnv) -> OrderEnforcingWrapper:
    """Add PettingZoo's `OrderEnforcingWrapper` (errors on use before `reset`, on a missing `step`)."""
    return OrderEnforcingWrapper(env)


#: A zero-argument constructor of a made env (`mas_envs.make(id, **kwargs)`, or `wrap(MyEnv(...))`): a
#: PettingZoo AEC env, possibly wrapped, whose `unwrapped` is a `TextAECEnv`.
EnvFactory: TypeAlias = "Callable[[], AECEnv[str, str, str]]"


def text_env(env: AECEnv[str, str, str]) -> TextAECEnv:
    """The `TextAECEnv` under `env` (PettingZoo's `unwrapped`, through any wrappers).

    What a trainer reads of an env beyond the PettingZoo API is declared on `TextAECEnv`, with defaults an
    env may override: `stop_strings`, `role_reward_agents`, `invalid_action_penalty`, `transcript`, `tasks`,
    `eval_task_source()`, `startup_warnings()`, `close()`. This is the one way to reach them.

    Raises:
        TypeError: `env` is not a `TextAECEnv` underneath (a trainer needs the members above).
    """
    inner = env.unwrapped
    if not isinstance(inner, TextAECEnv):
        raise TypeError(
            f"{type(inner).__name__} is not a mas_envs.TextAECEnv: a trainer reads the text-env contract "
            "(stop_strings, transcript, eval_task_source, ...); subclass TextAECEnv (docs/envs.md)"
        )
    return inner


class TextAECEnv(AECEnv[str, str, str]):
    """Base class for text environments with turn order decided at run time (see the module docstring).

    Args:
        tasks: the env's own task list for `reset(seed=...)` / `options={"task_index": i}`: a sequence of row
            dicts, or a bundled set name / file path / hub id for `mas_envs.data.load_tasks`. Default:
            the class's `default_tasks`, loaded on first use.
        invalid_action_penalty: the coefficient c (default: the class's `default_invalid_action_penalty`).
        max_turns: turn cap; reaching it truncates every agent. `None` leaves the episode length to the env.
        render_mode: `None` or `"ansi"`.

    Raises:
        ValueError: on a negative penalty, a `max_turns` below 1 or an unknown render mode.
    """

    metadata: ClassVar[dict[str, Any]] = {
        "name": "text_aec_v0",
        "render_modes": ["ansi"],
        "is_parallelizable": False,
    }
    # subclasses set a tuple; each instance holds its own list (PettingZoo's type)
    possible_agents: Sequence[str] = ()
    stop_strings: ClassVar[dict[str, tuple[str, ...]]] = {}
    fuzz_fragments: ClassVar[dict[str, tuple[str, ...]]] = {}
    default_invalid_action_penalty: ClassVar[float] = 0.1
    default_tasks: ClassVar[str | None] = None
    default_eval_tasks: ClassVar[str | None] = None
    # agents whose turns the env scores by role (Outcome.role_rewards); a trainer refuses a role weight for others
    role_reward_agents: ClassVar[tuple[str, ...]] = ()
    # True: each agent gets its own outcome reward (Outcome.agent_rewards; a zero-sum game), not the team reward R.
    # A trainer that scores every turn with R must refuse such an env or read infos[agent]["agent_rewards"].
    per_agent_rewards: ClassVar[bool] = False
    # True: the tasks are starting positions (a game's deals), not questions with answers to hold out; with no eval
    # set configured, evaluation plays the env's own task list (mas_train.tasks.eval_tasks) and training keeps it
    eval_plays_train_tasks: ClassVar[bool] = False

    # --- hooks a subclass implements -------------------------------------------------------------------
    def start_episode(self, task: dict[str, Any]) -> str:
        """Set up the episode for `task` (a row dict, already copied); return the first agent to act.

        Raise `ValueError` for a task the env cannot play (e.g. no gold answer): `reset` passes it on.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement start_episode(task)")

    def prompt_messages(self, agent: str) -> list[dict[str, str]]:
        """That agent's prompt in the current state, as chat messages (`{"role": ..., "content": ...}`)."""
        raise NotImplementedError(f"{type(self).__name__} must implement prompt_messages(agent)")

    def apply_action(self, agent: str, action: str) -> Transition:
        """Apply `agent`'s text action: update the episode state and route. Must not raise on any string."""
        raise NotImplementedError(f"{type(self).__name__} must implement apply_action(agent, action)")

    def episode_outcome(self) -> Outcome:
        """Team reward, success and per-episode metrics of the finished episode (called once)."""
        raise NotImplementedError(f"{type(self).__name__} must implement episode_outcome()")

    @classmethod
    def eval_task_source(cls) -> str | None:
        """The task spec of this env's default evaluation set, or `None` when it has none.

        `default_eval_tasks` when set; else, when `default_tasks` is a bundled ``<name>-train`` set with a
        bundled ``<name>-test`` twin, that twin; else `None`. Trainers and `mas-eval` call this (and only
        this) when no eval set is configured; with `None` they must ask the user for one.
        """
        if cls.default_eval_tasks is not None:
            return cls.default_eval_tasks
        train = cls.default_tasks
        if isinstance(train, str) and train.endswith("-train"):
            from mas_envs.data import BUNDLED

            twin = train[: -len("-train")] + "-test"
            if twin in BUNDLED:
                return twin
        return None

    @classmethod
    def golden_episodes(cls) -> list[GoldenEpisode]:
        """Scripted episodes with exact expected results for `mas_envs.testing.check_env` (default: none)."""
        return []

    def exact_evaluation(self, score: Scorer) -> ExactEvaluation | None:
        """An evaluation of the policy computed from its log-probabilities instead of sampled episodes (e.g. a
        game's exploitability from the action probabilities at every information set): no sampling noise.

        Trainers and `mas-eval` call it once per evaluation, after the sampled episodes, with `score`: the
        total log-probability of given replies under each agent's own policy (`Scorer`). It must not change
        this env's episode state (work on a copy). Default: `None`, no exact evaluation and no scoring cost.
        """
        return None

    def startup_warnings(self) -> list[str]:
        """Problems worth telling the user before training starts that need not stop it (e.g. a retrieval
        server that does not answer yet). Trainers print each as one line. Default: none."""
        return []

    @classmethod
    def conformance_kwargs(cls) -> dict[str, Any]:
        """Constructor kwargs `check_env` builds the env with (e.g. a stub retriever, so random play needs
        no index). Default: none."""
        return {}

    # --- PettingZoo API ----------------------------------------------------------------------------------
    def __init__(
        self,
        *,
        tasks: Sequence[Mapping[str, Any]] | str | None = None,
        invalid_action_penalty: float | None = None,
        max_turns: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__()
        if not self.possible_agents:
            raise TypeError(f"{type(self).__name__} must set the class attribute possible_agents")
        self.possible_agents = list(self.possible_agents)
        c = self.default_invalid_action_penalty if invalid_action_penalty is None else invalid_action_penalty
        if not isinstance(c, numbers.Real) or isinstance(c, bool):
            raise TypeError(f"invalid_action_penalty must be a number, got {c!r}")
        if not c >= 0:
            raise ValueError(f"invalid_action_penalty must be >= 0, got {c!r}")
        if max_turns is not None and (
            not isinstance(max_turns, numbers.Integral) or isinstance(max_turns, bool)
        ):
            raise TypeError(f"max_turns must be an int or None, got {max_turns!r}")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1 or None, got {max_turns!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode={render_mode!r} is not supported; use one of {self.metadata['render_modes']}"
            )
        self.invalid_action_penalty: float = float(c)
        self.max_turns: int | None = None if max_turns is None else int(max_turns)
        self.render_mode: str | None = render_mode
        self.stop_strings = {a: tuple(self.stop_strings.get(a, ())) for a in self.possible_agents}
        self._task_source: Sequence[Mapping[str, Any]] | str | None = (
            tasks if tasks is not None else self.default_tasks
        )
        # rows are copied at reset, so a caller's list can be shared by many envs without copying it here
        self._tasks: Sequence[Mapping[str, Any]] | None = (
            tasks if tasks is not None and not isinstance(tasks, str) else None
        )
        self._observation_spaces: dict[str, UnicodeText] = {a: UnicodeText() for a in self.possible_agents}
        self._action_spaces: dict[str, UnicodeText] = {
            a: UnicodeText(fragments=self.fuzz_fragments.get(a, ()) + self.stop_strings.get(a, ()))
            for a in self.possible_agents
        }
        self.np_random: np.random.Generator = np.random.default_rng()
        self.agents: list[str] = []
        self.task: dict[str, Any] | None = None
        self.task_id: str = ""
        self.turn: int = 0
        self.transcript: list[TranscriptEntry] = []
        self.outcome: Outcome | None = None  # set when the episode ends
        self.truncated: bool = False

    def observation_space(self, agent: str) -> UnicodeText:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> UnicodeText:
        return self._action_spaces[agent]

    @property
    def tasks(self) -> Sequence[Mapping[str, Any]]:
        """The env's own task list (loaded on first access when given by name or path, once per process)."""
        if self._tasks is None:
            if self._task_source is None:
                raise ValueError(
                    f"{type(self).__name__} has no task list: pass tasks=... to the constructor or "
                    'reset(options={"task": {...}})'
                )
            self._tasks = _load_shared(self._task_source)
        return self._tasks

    @property
    def current_task(self) -> dict[str, Any]:
        """The live episode's task row (`self.task`, never `None`).

        Raises:
            RuntimeError: `reset` has not been called yet.
        """
        if self.task is None:
            raise RuntimeError(f"{type(self).__name__} has no task yet: call reset() first")
        return self.task

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if isinstance(self._task_source, str):
            state["_tasks"] = None  # reloaded (from the per-process cache) on first use: keeps pickles small
        return state

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Start an episode; see the module docstring for how the task is chosen.

        Raises:
            ValueError: `options["task"]` is not a mapping, or its `question` is missing or not a `str`; the
                env's task list is empty; or the subclass rejects the task (e.g. a math task with no answer).
                After a failed reset the env has no live agents.
            TypeError: `options["task_index"]` is not an int.
            IndexError: `options["task_index"]` is out of range.
        """
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        options = options or {}
        if options.get("task") is not None:
            task = options["task"]
            if not isinstance(task, Mapping) or "question" not in task:
                raise ValueError(
                    f'options["task"] must be a dict with at least a "question" key, got {task!r}'
                )
            task = dict(task)
        elif options.get("task_index") is not None:
            i = options["task_index"]
            if not isinstance(i, numbers.Integral) or isinstance(i, bool):
                raise TypeError(f'options["task_index"] must be an int, got {i!r}')
            if not -len(self.tasks) <= int(i) < len(self.tasks):
                raise IndexError(f"task_index {i} out of range for {len(self.tasks)} tasks")
            task = dict(self.tasks[int(i)])
        else:
            if not len(self.tasks):
                raise ValueError(
                    f"{type(self).__name__}'s task list is empty: pass tasks=[...] with at least one row, "
                    'or reset(options={"task": {...}})'
                )
            task = dict(self.tasks[int(self.np_random.integers(len(self.tasks)))])
        if not isinstance(task.get("question"), str):
            raise ValueError(f'the task\'s "question" must be a str, got {task.get("question")!r}')
        self.task = task
        self.task_id = task_id_of(task)
        self.turn = 0
        self.transcript = []
        self.outcome = None
        self.truncated = False
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos: dict[str, dict[str, Any]] = {
            a: {"invalid_action": False, "parsed_answer": None} for a in self.agents
        }
        self._skip_agent_selection = None
        try:
            first = self.start_episode(task)
            self._check_agent(first)
        except BaseException:
            self.agents = []  # a half-started episode must not be playable
            raise
        self.agent_selection = first
        self._refresh_infos()

    def observe(self, agent: str) -> TextObservation:
        """The agent's full prompt (its chat messages joined by `messages_to_text`), a `str`
        (`TextObservation`: with the `dtype` of its `UnicodeText` space)."""
        return TextObservation(messages_to_text(self.prompt_messages(agent)))

    def step(self, action: str | None) -> None:
        """Apply the selected agent's text action (`None` only for a terminated or truncated agent).

        A live agent's action that is not a `str` (`None` from a failed generation, `bytes`, a number) never
        raises: it is an invalid action (penalty `-c`), and the env routes as if the agent had written `""`.

        Raises:
            ValueError: `action` is not `None` for a dead agent (PettingZoo's rule).
        """
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        not_text = not isinstance(action, str)
        text = action if isinstance(action, str) else ""
        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        transition = self.apply_action(agent, text)
        if not_text:
            transition = Transition(invalid=True, next_agent=transition.next_agent)
        self.transcript.append(TranscriptEntry(self.turn, agent, text, transition.invalid))
        self.infos[agent]["invalid_action"] = bool(transition.invalid)
        self.infos[agent]["parsed_answer"] = None if transition.answer is None else str(transition.answer)
        if transition.invalid:
            self.rewards[agent] -= self.invalid_action_penalty
        self.turn += 1
        if transition.next_agent is None or (self.max_turns is not None and self.turn >= self.max_turns):
            self.truncated = transition.next_agent is not None
            done = self.truncations if self.truncated else self.terminations
            outcome = self.outcome = self.episode_outcome()
            role = self._apply_role_rewards(outcome.role_rewards)
            own = self._check_agent_rewards(outcome)
            for a in self.agents:
                done[a] = True
                self.rewards[a] += own[a]
                self.infos[a]["team_reward"] = float(outcome.team_reward)
                self.infos[a]["success"] = bool(outcome.success)
                self.infos[a]["episode_metrics"] = {str(k): float(v) for k, v in outcome.metrics.items()}
                self.infos[a]["role_rewards"] = dict(role)
                self.infos[a]["agent_rewards"] = dict(own)
        else:
            self._check_agent(transition.next_agent)
            self.agent_selection = transition.next_agent
        self._refresh_infos()
        self._accumulate_rewards()

    def render(self) -> str | None:
        """The transcript as text when `render_mode == "ansi"`; `None` (with no output) otherwise."""
        if self.render_mode == "ansi":
            return self.state()
        return None

    def state(self) -> str:
        """The whole episode so far as a readable transcript."""
        lines = [f"=== {self.metadata['name']} | task {self.task_id} ==="]
        if self.task is not None:
            lines.append(f"Question: {self.task.get('question', '')}")
        for e in self.transcript:
            flag = " (invalid)" if e.invalid else ""
            if e.role_reward is not None:
                flag += f" (role reward {e.role_reward:g})"
            lines.append(f"--- turn {e.turn} | {e.speaker}{flag} ---")
            lines.append(e.text)
        if self.outcome is not None:
            how = "truncated" if self.truncated else "terminated"
            lines.append(
                f"=== {how}: team reward {self.outcome.team_reward:g}, success {self.outcome.success} ==="
            )
        return "\n".join(lines)

    def close(self) -> None:
        """Nothing to release (envs hold no sockets or files)."""

    # --- helpers for subclasses ---------------------------------------------------------------------------
    def add_note(self, text: str) -> None:
        """Add an env message (e.g. retrieved passages) to the transcript at the current turn."""
        self.transcript.append(TranscriptEntry(self.turn, "env", text))

    def _apply_role_rewards(self, role_rewards: Mapping[int, float]) -> dict[int, float]:
        """Check the outcome's role scores against the transcript and write them onto its entries.

        Raises:
            RuntimeError: a role score for a turn that is no action, for an agent outside
                `role_reward_agents`, or one that is not a finite number (an env bug: a NaN here would reach
                every advantage of its task group).
        """
        if not role_rewards:
            return {}
        actions = {e.turn: i for i, e in enumerate(self.transcript) if e.speaker != "env"}
        allowed = tuple(self.role_reward_agents)
        out: dict[int, float] = {}
        for turn, value in role_rewards.items():
            i = (
                actions.get(turn)
                if isinstance(turn, numbers.Integral) and not isinstance(turn, bool)
                else None
            )
            if i is None:
                raise RuntimeError(
                    f"{type(self).__name__} gave a role reward for turn {turn!r}, which is no action of this "
                    f"episode (action turns: {sorted(actions)})"
                )
            speaker = self.transcript[i].speaker
            if speaker not in allowed:
                raise RuntimeError(
                    f"{type(self).__name__} gave a role reward to {speaker!r} (turn {turn}), which is not in its "
                    f"role_reward_agents {allowed}; add the agent there"
                )
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or not np.isfinite(value):
                raise RuntimeError(
                    f"{type(self).__name__} gave turn {turn} the role reward {value!r}; it must be a finite number"
                )
            out[int(turn)] = float(value)
            self.transcript[i] = dataclasses.replace(self.transcript[i], role_reward=float(value))
        return out

    def _check_agent_rewards(self, outcome: Outcome) -> dict[str, float]:
        """Each possible agent's outcome reward: `outcome.agent_rewards` where the env declares
        `per_agent_rewards`, else the team reward for everyone.

        Raises:
            RuntimeError: an env with `per_agent_rewards` left an agent out, named an unknown one or gave a
                value that is not a finite number; or a team env gave `agent_rewards` (an env bug).
        """
        given = outcome.agent_rewards
        if not self.per_agent_rewards:
            if given:
                raise RuntimeError(
                    f"{type(self).__name__} gave Outcome.agent_rewards but does not declare per_agent_rewards = True"
                )
            return dict.fromkeys(self.possible_agents, float(outcome.team_reward))
        if set(given) != set(self.possible_agents):
            raise RuntimeError(
                f"{type(self).__name__} declares per_agent_rewards but gave agent_rewards for {sorted(given)}; "
                f"it must give one for each of {list(self.possible_agents)}"
            )
        out: dict[str, float] = {}
        for a, value in given.items():
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or not np.isfinite(value):
                raise RuntimeError(
                    f"{type(self).__name__} gave {a!r} the outcome reward {value!r}; it must be a finite number"
                )
            out[a] = float(value)
        return out

    def _check_agent(self, agent: str) -> None:
        if agent not in self.possible_agents:
            raise RuntimeError(
                f"{type(self).__name__} routed to unknown agent {agent!r}; possible agents: {self.possible_agents}"
            )

    def _refresh_infos(self) -> None:
        for a in self.agents:
            info = self.infos[a]
            info["messages"] = self.prompt_messages(a)
            info["turn"] = self.turn
            info["task_id"] = self.task_id
