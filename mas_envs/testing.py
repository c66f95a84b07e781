"""Conformance kit: `check_env(env_fn)` runs every check a `mas_envs` text env must pass.

Third-party envs use it the same way our test suite does::

    from functools import partial
    import mas_envs
    from mas_envs.testing import check_env

    report = check_env(partial(mas_envs.make, "my-env-v0"))

`env_fn(**kwargs)` must build a fresh env and accept the env's constructor keyword arguments (golden episodes
and the render check pass some). Every env is built with the class's `conformance_kwargs()` (e.g. a stub
retriever) unless the caller's kwargs override them.

The checks, in order:

1. PettingZoo's own, unpatched `api_test` on the env and on `env.unwrapped` (text observations pass its dtype
   check: they are `TextObservation`s, whose `dtype` is their `UnicodeText` space's), with every warning an error except
   `ALLOWED_WARNINGS` (warnings that hold for any text env: non-NumPy observations, non-Box spaces, agent
   names without a `_<number>` suffix).
2. The design contract: `stop_strings` (a tuple of str per agent), `invalid_action_penalty`,
   `role_reward_agents` (a tuple of possible agents), the `infos` keys `messages` / `turn` / `task_id` /
   `invalid_action`, and `team_reward` / `success` / `episode_metrics` (str -> finite float) /
   `role_rewards` (action turn -> finite float, only for turns of `role_reward_agents`, and equal for every
   agent) at the end.
3. PettingZoo's `seed_test`, and: the same seed and the same actions give an identical transcript.
4. Pickling after `reset`: the copy plays on exactly like the original.
5. Random play (`fuzz_episodes` episodes of `action_space(agent).sample()` text, thousands of actions): no
   exception, the standard loop ends with `agents == []`, `agent_selection` is always a live agent, and each
   agent's return equals its outcome reward `infos[agent]["agent_rewards"][agent] - c * (its invalid turns)`
   (the outcome reward is `team_reward` unless the env declares `per_agent_rewards`; role scores never enter
   the returns), and every role score is also on its transcript entry.
6. The env's golden episodes (`env.unwrapped.golden_episodes()`): agents, turn count, returns, team reward,
   success and (where the episode lists them) role scores exactly as scripted.
7. `render_mode="ansi"` returns the transcript as a `str`.
"""

from __future__ import annotations

import math
import pickle
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pettingzoo.test import api_test, seed_test

from mas_envs.core import GoldenEpisode, TextAECEnv

__all__ = ["ALLOWED_WARNINGS", "CheckReport", "check_env", "play_golden_episode", "play_random_episode"]

# Warnings PettingZoo's api_test raises for every text env; anything else fails the check.
ALLOWED_WARNINGS: tuple[str, ...] = (
    r"^Observation is not a NumPy array$",
    r"^Observation space for each agent probably should be gymnasium\.spaces\.box or gymnasium\.spaces\.discrete$",
    r"^Action space for each agent probably should be gymnasium\.spaces\.box or gymnasium\.spaces\.discrete$",
    r"^We recommend agents to be named in the format <descriptor>_<number>, like \"player_0\"$",
)


@dataclass
class CheckReport:
    """What `check_env` ran: counts, so a test can assert the checks did real work."""

    env_name: str
    random_episodes: int = 0
    random_actions: int = 0
    invalid_random_actions: int = 0
    golden_episodes: list[str] = field(default_factory=list)


def _run_quietly(fn: Callable[[], Any], allowed: tuple[str, ...]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    bad = [w for w in caught if not any(re.search(p, str(w.message)) for p in allowed)]
    if bad:
        lines = "\n".join(f"  {w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in bad)
        raise AssertionError(f"warnings outside the allow-list:\n{lines}")


def _check_contract(env: Any) -> None:
    raw = env.unwrapped
    assert isinstance(raw, TextAECEnv), f"env.unwrapped must be a TextAECEnv, got {type(raw).__name__}"
    assert isinstance(raw.stop_strings, dict) and set(raw.stop_strings) == set(raw.possible_agents), (
        "stop_strings must map every possible agent to a tuple of strings"
    )
    for a, stops in raw.stop_strings.items():
        assert isinstance(stops, tuple) and all(isinstance(s, str) and s for s in stops), (
            f"stop_strings[{a!r}] must be a tuple of non-empty str, got {stops!r}"
        )
    c = raw.invalid_action_penalty
    assert isinstance(c, float) and c >= 0, f"invalid_action_penalty must be a float >= 0, got {c!r}"
    assert isinstance(type(raw).per_agent_rewards, bool), "per_agent_rewards must be a bool"
    role = type(raw).role_reward_agents
    assert isinstance(role, tuple) and set(role) <= set(raw.possible_agents), (
        f"role_reward_agents must be a tuple of possible agents, got {role!r}"
    )


def _check_role_rewards(raw: Any, final_info: dict[str, dict[str, Any]], actors: dict[int, str]) -> None:
    """`role_rewards` at the end: the same dict for every agent, keyed by action turns of role agents, finite
    floats, and written onto the transcript."""
    seen = [info.get("role_rewards") for info in final_info.values()]
    role = seen[0]
    assert all(r == role for r in seen), f"agents disagree on role_rewards: {seen}"
    assert isinstance(role, dict), f"infos[agent]['role_rewards'] must be a dict at the end, got {role!r}"
    allowed = set(type(raw).role_reward_agents)
    for turn, value in role.items():
        assert isinstance(turn, int) and turn in actors, f"role_rewards key {turn!r} is not an action turn"
        assert actors[turn] in allowed, (
            f"role_rewards scores turn {turn} of {actors[turn]!r}, which is not in role_reward_agents {allowed}"
        )
        assert isinstance(value, float) and math.isfinite(value), (
            f"role_rewards[{turn}] must be a finite float, got {value!r}"
        )
    on_transcript = {e.turn: e.role_reward for e in raw.transcript if e.role_reward is not None}
    assert on_transcript == role, f"transcript role rewards {on_transcript} differ from infos' {role}"


def _check_agent_rewards(raw: Any, final_info: dict[str, dict[str, Any]], team: float) -> dict[str, float]:
    """`agent_rewards` at the end: the same dict for every agent, a finite float per possible agent, and the team
    reward for each unless the env declares `per_agent_rewards`. Returns it."""
    seen = [info.get("agent_rewards") for info in final_info.values()]
    own = seen[0]
    assert all(o == own for o in seen), f"agents disagree on agent_rewards: {seen}"
    assert isinstance(own, dict) and set(own) == set(raw.possible_agents), (
        f"infos[agent]['agent_rewards'] must map every possible agent to its outcome reward, got {own!r}"
    )
    assert all(isinstance(v, float) and math.isfinite(v) for v in own.values()), (
        f"agent_rewards must be finite floats, got {own!r}"
    )
    if not type(raw).per_agent_rewards:
        assert all(v == team for v in own.values()), (
            f"a team env's agent_rewards must all be its team_reward {team}, got {own!r}"
        )
    return own


def _check_infos(env: Any, agent: str, turn: int) -> None:
    info = env.infos[agent]
    msgs = info.get("messages")
    assert isinstance(msgs, list) and msgs, f"infos[{agent!r}]['messages'] must be a non-empty list"
    for m in msgs:
        assert (
            isinstance(m, dict)
            and m.get("role") in ("system", "user", "assistant")
            and isinstance(m.get("content"), str)
        ), f"bad chat message in infos[{agent!r}]['messages']: {m!r}"
    assert info.get("turn") == turn, f"infos[{agent!r}]['turn'] is {info.get('turn')!r}, expected {turn}"
    assert isinstance(info.get("task_id"), str) and info["task_id"], (
        f"infos[{agent!r}]['task_id'] must be a str"
    )
    assert isinstance(info.get("invalid_action"), bool), f"infos[{agent!r}]['invalid_action'] must be a bool"


def play_random_episode(env: Any, rng: np.random.Generator, seed: int) -> tuple[int, int]:
    """Play one episode with random text actions, checking the loop invariants. Returns (actions, invalid).

    Raises:
        AssertionError: an invariant failed (the message says which).
    """
    raw = env.unwrapped
    env.reset(seed=seed)
    for a in env.agents:
        env.action_space(a).seed(int(rng.integers(2**31)))
    returns = dict.fromkeys(env.agents, 0.0)
    invalid = dict.fromkeys(env.agents, 0)
    n_actions = turn = 0
    final_info: dict[str, dict[str, Any]] = {}
    actors: dict[int, str] = {}
    for agent in env.agent_iter(10_000):
        assert agent in env.agents, f"agent_selection {agent!r} is not in agents {env.agents}"
        obs, reward, termination, truncation, info = env.last()
        returns[agent] += reward
        assert isinstance(obs, str) and obs, f"observe({agent!r}) must be a non-empty str"
        if termination or truncation:
            assert "team_reward" in info and "success" in info, (
                f"infos[{agent!r}] lacks team_reward/success at the end"
            )
            metrics = info.get("episode_metrics")
            assert isinstance(metrics, dict) and all(
                isinstance(k, str) and isinstance(v, float) and math.isfinite(v) for k, v in metrics.items()
            ), f"infos[{agent!r}]['episode_metrics'] must be a dict of str -> finite float, got {metrics!r}"
            final_info[agent] = dict(info)
            env.step(None)
            continue
        assert not any(env.terminations.values()) and not any(env.truncations.values()), (
            "a live agent was selected while another agent is already done"
        )
        _check_infos(env, agent, turn)
        action = env.action_space(agent).sample()
        actors[turn] = agent
        env.step(action)
        turn += 1
        n_actions += 1
        if env.agents and agent in env.infos:
            invalid[agent] += bool(env.infos[agent]["invalid_action"])
    assert env.agents == [], f"the standard loop ended with live agents {env.agents}"
    assert set(final_info) == set(raw.possible_agents), (
        "every agent must be stepped dead exactly once at the end"
    )
    team = {i["team_reward"] for i in final_info.values()}
    assert len(team) == 1, f"agents disagree on team_reward: {team}"
    _check_role_rewards(raw, final_info, actors)
    (r,) = team
    own = _check_agent_rewards(raw, final_info, r)
    c = raw.invalid_action_penalty
    for a, ret in returns.items():
        expected = own[a] - c * invalid[a]
        assert math.isclose(ret, expected, abs_tol=1e-9), (
            f"{a!r} returned {ret}, expected its outcome reward {own[a]} - {c} * {invalid[a]} invalid turns "
            f"= {expected}"
        )
    return n_actions, sum(invalid.values())


def play_golden_episode(env_fn: Callable[..., Any], g: GoldenEpisode) -> str:
    """Replay a golden episode and check it exactly; returns the transcript.

    Raises:
        AssertionError: the env deviated from the script (the message says where).
    """
    env = env_fn(**g.env_kwargs)
    env.reset(seed=0, options={"task": g.task})
    returns = dict.fromkeys(env.agents, 0.0)
    actors: list[str] = []
    actions = list(g.actions)
    ended: dict[str, dict[str, Any]] = {}
    for agent in env.agent_iter(10_000):
        _, reward, termination, truncation, info = env.last()
        returns[agent] += reward
        if termination or truncation:
            assert truncation == g.truncated, f"[{g.name}] truncated={truncation}, expected {g.truncated}"
            ended[agent] = dict(info)
            env.step(None)
            continue
        assert actions, f"[{g.name}] the env asked {agent!r} for turn {len(actors)} but the script has ended"
        actors.append(agent)
        env.step(actions.pop(0))
    assert tuple(actors) == tuple(g.agents), f"[{g.name}] agents acted as {actors}, expected {list(g.agents)}"
    for a, expected in g.returns.items():
        assert math.isclose(returns[a], expected, abs_tol=1e-9), (
            f"[{g.name}] {a!r} returned {returns[a]}, expected {expected}"
        )
    assert set(ended) == set(env.unwrapped.possible_agents), (
        f"[{g.name}] agents {sorted(ended)} ended, not all"
    )
    for info in ended.values():
        assert info["team_reward"] == g.team_reward, (
            f"[{g.name}] team_reward {info['team_reward']}, expected {g.team_reward}"
        )
        assert info["success"] == g.success, f"[{g.name}] success {info['success']}, expected {g.success}"
        assert info["turn"] == len(g.actions), f"[{g.name}] {info['turn']} turns, expected {len(g.actions)}"
    # the k-th action is turn k (env notes share the turn of the action they follow)
    _check_role_rewards(env.unwrapped, ended, dict(enumerate(actors)))
    got = next(iter(ended.values()))["role_rewards"]
    if g.role_rewards is not None:
        assert got == g.role_rewards, f"[{g.name}] role_rewards {got}, expected {g.role_rewards}"
    return env.unwrapped.state()


def _scripted_transcript(env_fn: Callable[..., Any], seed: int) -> str:
    env = env_fn()
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for a in env.agents:
        env.action_space(a).seed(int(rng.integers(2**31)))
    for agent in env.agent_iter(10_000):
        _, _, termination, truncation, _ = env.last()
        env.step(None if termination or truncation else env.action_space(agent).sample())
    return env.unwrapped.state()


def _check_pickle(env_fn: Callable[..., Any], seed: int) -> None:
    env = env_fn()
    env.reset(seed=seed)
    copy = pickle.loads(pickle.dumps(env))
    for e in (env, copy):
        for i, a in enumerate(e.agents):
            e.action_space(a).seed(seed + i)
    for agent, agent_copy in zip(env.agent_iter(10_000), copy.agent_iter(10_000), strict=False):
        assert agent == agent_copy, "the unpickled env selects a different agent"
        last, last_copy = env.last(), copy.last()
        assert repr(last) == repr(last_copy), "the unpickled env's last() differs"
        done = last[2] or last[3]
        env.step(None if done else env.action_space(agent).sample())
        copy.step(None if done else copy.action_space(agent).sample())
    assert env.agents == copy.agents == []
    assert env.unwrapped.state() == copy.unwrapped.state(), "the unpickled env's transcript differs"


def check_env(
    env_fn: Callable[..., Any],
    *,
    fuzz_episodes: int = 1000,
    seed: int = 0,
    allowed_warnings: tuple[str, ...] = ALLOWED_WARNINGS,
) -> CheckReport:
    """Run the conformance checks listed in the module docstring on envs built by `env_fn`.

    Args:
        env_fn: `env_fn(**kwargs)` returns a fresh env (wrapped or raw).
        fuzz_episodes: number of random-play episodes (check 5).
        seed: base seed of the random play.
        allowed_warnings: regexes of warnings that do not fail the check.

    Returns:
        A `CheckReport` with the counts of what ran.

    Raises:
        AssertionError: a check failed; the message names the check and the difference.
    """
    probe = env_fn()
    defaults = type(probe.unwrapped).conformance_kwargs()
    if defaults:
        base_fn = env_fn

        def env_fn(**kwargs: Any) -> Any:
            return base_fn(**{**defaults, **kwargs})

        probe = env_fn()
    report = CheckReport(env_name=str(probe.unwrapped))
    _check_contract(probe)

    _run_quietly(lambda: api_test(env_fn(), num_cycles=1000), allowed_warnings)
    _run_quietly(lambda: api_test(env_fn().unwrapped, num_cycles=1000), allowed_warnings)
    _run_quietly(lambda: seed_test(env_fn, num_cycles=500), allowed_warnings)

    assert _scripted_transcript(env_fn, seed) == _scripted_transcript(env_fn, seed), (
        "the same seed and the same actions gave different transcripts"
    )
    _check_pickle(env_fn, seed)

    rng = np.random.default_rng(seed)
    env = env_fn()
    for i in range(fuzz_episodes):
        n, bad = play_random_episode(env, rng, seed + i)
        report.random_episodes += 1
        report.random_actions += n
        report.invalid_random_actions += bad

    for g in type(probe.unwrapped).golden_episodes():
        play_golden_episode(env_fn, g)
        report.golden_episodes.append(g.name)

    if "ansi" in probe.unwrapped.metadata.get("render_modes", ()):
        env = env_fn(render_mode="ansi")
        env.reset(seed=seed)
        text = env.render()
        assert isinstance(text, str) and text, "render() with render_mode='ansi' must return the transcript"
    return report
