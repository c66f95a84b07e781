"""Self-play with a league: who sits in each seat of a game's task group.

Self-play alone collapses (tinker's tic-tac-toe recipe: draws against minimax by step 40, collapse by step
80-110); the fix of the field is a league of fixed opponents and frozen copies of earlier checkpoints. A
:class:`League` draws, for every task group of a training step, one opponent from a weighted mix
(``league`` of the run config, :class:`~mas_train.config.sections.LeagueConfig`):

* ``self_play``: every seat is the learner (SPIRAL's self-play; every seat's turns train);
* ``snapshots``: a frozen **snapshot** of the learner, taken every ``snapshot_every`` steps (the newest
  ``max_snapshots`` are kept; uniform among them; weight 0 until the first exists);
* ``scripted``: a scripted policy of :mod:`mas_envs.games.opponents` (``random``, ``minimax?epsilon=0.2``,
  ``equilibrium``), each with its own weight.

Against a snapshot or a script one seat, drawn uniformly among the seats whose model group trains, is the
learner: only its turns become samples; the opponent plays every other seat. The G episodes of a task group
share the draw (so their group baseline compares like with like). Draws are seeded by ``(seed, step, round, task
index)`` only, so a resumed run draws the same opponents. Evaluation never uses the league: it plays the learner against itself (and the env's exact
evaluation, e.g. Kuhn poker's exploitability).

A snapshot is, per trainable model group, a copy of the group's LoRA adapter **as its generation backend samples
with it now** in a new adapter ``league-<step>-<group>`` on the backend's own ``PeftModel``: no second copy of the
base weights; the snapshot's rows generate in the same batched call machinery (PEFT's per-row adapters). A
checkpoint holds the kept snapshots in PEFT's format (``league/<snapshot>/<group>/``) and the trainer state their
names; :meth:`League.load` puts them back, so a resumed run continues exactly.

Metrics (``league/…``): the share of task groups per opponent kind (``league/episodes/<opponent>``), the learner's
mean return against each non-self opponent (``league/return/<opponent>``; for Kuhn poker chips per hand, for
tic-tac-toe +1/0/-1), and the number of kept snapshots. The opponents themselves (how a script or a snapshot plays
its turns) are :mod:`mas_train.opponents`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mas_train import lora
from mas_train.opponents import Opponent, ScriptedOpponent, SnapshotOpponent

if TYPE_CHECKING:
    from pettingzoo import AECEnv

    from mas_train.config import ResolvedConfig
    from mas_train.config.sections import LeagueConfig
    from mas_train.hosting.protocols import WorkerPool
    from mas_train.samples import Trajectory

__all__ = ["League", "check_league", "game_of", "make_league"]

SELF = "self"


def game_of(env: AECEnv[str, str, str]) -> str | None:
    """The game's name (``metadata["name"]``, e.g. ``kuhn-poker-v0``) when ``env`` is a two-seat game of
    :mod:`mas_envs.games`, else ``None``."""
    from mas_envs.core import text_env
    from mas_envs.games.base import TextGameEnv

    inner = text_env(env)
    return str(inner.metadata.get("name", "")) if isinstance(inner, TextGameEnv) else None


def make_league(resolved: ResolvedConfig, probe: AECEnv[str, str, str], pool: WorkerPool) -> League:
    """The run's :class:`League` (``league.enabled``), on the probe env's seats and the pool's trainable groups."""
    groups = resolved.model_groups
    return League(
        resolved.config.league,
        seats=list(probe.possible_agents),
        game=game_of(probe) or "",
        seed=resolved.config.seed,
        pool=pool,
        agent_groups={a: ra.model_group for a, ra in resolved.agents.items()},
        trainable=[g for g, mg in groups.items() if mg.trainable],
        lora_cfgs={g: mg.lora for g, mg in groups.items()},
        legal_moves_only=resolved.config.legal_moves_only,
    )


def check_league(resolved: ResolvedConfig, game: str | None) -> None:
    """Refuse a league or evaluation opponents the run cannot honour, before any model loads (one line saying
    what to do).

    Raises:
        ValueError: ``league.enabled``, ``eval_opponents`` or ``legal_moves_only`` on an env that is not a game
            (``game`` None), ``legal_moves_only`` with a backend that cannot score or a temperature other than 1, a
            scripted opponent that does not play this game, a non-local pool, or a trainable model group that is not a
            LoRA adapter sampled by the HF backend (snapshots are adapters on the group's base).
    """
    cfg = resolved.config
    if cfg.legal_moves_only:
        if game is None:
            raise ValueError(f"legal_moves_only: env {cfg.env!r} is not a game of mas_envs.games; drop it")
        for name, ra in resolved.agents.items():
            g = resolved.model_groups[ra.model_group]
            if g.backend != "hf":
                raise ValueError(
                    f"legal_moves_only scores the legal moves with the model, which only the hf backend can; agent "
                    f"{name!r} uses {g.backend!r}"
                )
            t = ra.sampling_params().temperature
            if g.trainable and t != 1.0:
                raise ValueError(
                    f"legal_moves_only draws moves by the model's own probabilities (temperature 1, the logprobs "
                    f"it records); agent {name!r} samples at {t}: set sampling.temperature 1"
                )
    if cfg.eval_opponents:
        if game is None:
            raise ValueError(
                f"eval_opponents: env {cfg.env!r} is not a game of mas_envs.games; drop eval_opponents"
            )
        from mas_envs.games.opponents import scripted_policy

        for spec in cfg.eval_opponents:
            scripted_policy(spec, game, 0)  # raises ValueError naming the problem
    if not cfg.league.enabled:
        return
    if game is None:
        raise ValueError(
            f"league.enabled: env {cfg.env!r} is not a game of mas_envs.games (no seats to fill); drop --league.enabled"
        )
    from mas_envs.games.opponents import scripted_policy

    for spec in cfg.league.scripted:
        scripted_policy(spec, game, 0)  # raises ValueError naming the problem
    if cfg.pool != "local":
        raise ValueError(
            "league snapshots live in this process's models; use --pool local with --league.enabled"
        )
    for name, g in resolved.model_groups.items():
        if not g.trainable:
            continue
        if g.lora is None or g.backend != "hf" or g.num_ranks > 1:
            raise ValueError(
                f"league snapshots are LoRA adapters sampled by the HF backend, but model group {name!r} is not "
                "(lora, backend hf, one rank); use a LoRA model_sharing with backend hf"
            )


class League:
    """Draws each task group's opponent and keeps the snapshots (see the module docstring).

    Args:
        cfg: the ``league`` section; seats: the game's seats (``possible_agents``); game: its
            ``metadata["name"]``; seed: the run seed.
        pool: the run's worker pool (snapshots are taken on its trainable groups' backends).
        agent_groups: agent → model group; trainable: the trainable model groups.
        lora_cfgs: model group → its LoRA settings (a snapshot adapter has the group's rank and targets).
        legal_moves_only: snapshots choose among the legal moves as the learner does (``legal_moves_only``).
    """

    def __init__(
        self,
        cfg: LeagueConfig,
        seats: Sequence[str],
        game: str,
        seed: int,
        pool: WorkerPool,
        agent_groups: Mapping[str, str],
        trainable: Sequence[str],
        lora_cfgs: Mapping[str, Any],
        legal_moves_only: bool = False,
    ) -> None:
        self.cfg = cfg
        self.legal_moves_only = legal_moves_only
        self.seats = list(seats)
        self.game = game
        self.seed = int(seed)
        self.pool = pool
        self.agent_groups = dict(agent_groups)
        self.trainable = list(trainable)
        self.lora_cfgs = dict(lora_cfgs)
        self.snapshots: list[int] = []  # the steps of the kept snapshots, oldest first

    # -- drawing ----------------------------------------------------------------------------------------------
    def weights(self) -> dict[str, float]:
        """Opponent name → its probability now (``self`` for self-play; ``snapshot`` only once one exists)."""
        w = {SELF: float(self.cfg.self_play)}
        if self.snapshots:
            w["snapshot"] = float(self.cfg.snapshots)
        for spec, v in self.cfg.scripted.items():
            w[spec] = w.get(spec, 0.0) + float(v)
        total = sum(w.values())
        return {k: v / total for k, v in w.items() if v > 0}

    def draw(self, step: int, salt: int = 0) -> Callable[[int], dict[str, Opponent]]:
        """The opponents of step ``step``'s rollout ``salt`` (dynamic sampling's round): a function of the task
        index giving seat → :class:`Opponent` for the seats the learner does not hold (empty: self-play)."""
        probs = self.weights()
        names = list(probs)
        p = np.array([probs[n] for n in names])
        # the learner holds a seat whose model group trains: a frozen seat's turns give no sample to learn from
        learners = [s for s in self.seats if self.agent_groups.get(s) in self.trainable] or self.seats

        def seats_of(t_idx: int) -> dict[str, Opponent]:
            from mas_train.prompts import request_seed

            rng = np.random.default_rng(request_seed(self.seed, "league", step, salt, t_idx))
            name = names[int(rng.choice(len(names), p=p))]
            if name == SELF:
                return {}
            learner = learners[int(rng.integers(len(learners)))]
            if name == "snapshot":
                at = self.snapshots[int(rng.integers(len(self.snapshots)))]
                opp: Opponent = SnapshotOpponent(
                    {g: self.adapter(at, g) for g in self.trainable},
                    self.pool,
                    self.agent_groups,
                    self.legal_moves_only,
                )
            else:
                opp = ScriptedOpponent(name, self.game, int(rng.integers(2**31)))
            return {s: opp for s in self.seats if s != learner}

        return seats_of

    # -- snapshots --------------------------------------------------------------------------------------------
    @staticmethod
    def adapter(step: int, group: str) -> str:
        return f"league-{step:06d}-{group}"

    def _model(self, group: str) -> Any:
        return self.pool.worker(group).backend.model  # type: ignore[attr-defined]

    def _add(self, step: int, group: str) -> str:
        """Add an empty snapshot adapter for ``group`` at ``step``, leaving every other parameter's
        ``requires_grad`` and the active adapter as they were."""
        model = self._model(group)
        name = self.adapter(step, group)
        # the snapshot's new parameters are not in the saved state, so they end frozen (requires_grad False)
        with lora.preserving_state(model):
            lora.add(model, self.lora_cfgs[group], name)
        return name

    def after_step(self, step: int) -> bool:
        """Take a snapshot after step ``step`` when it is due (``step % snapshot_every == 0``; never with a
        ``snapshots`` weight of 0, which would never draw it) and drop the oldest beyond ``max_snapshots``;
        ``True`` when one was taken."""
        import torch

        if step % self.cfg.snapshot_every or self.cfg.snapshots <= 0:
            return False
        for g in self.trainable:
            model = self._model(g)
            name = self._add(step, g)
            src = self.pool.worker(g).policy.adapter  # type: ignore[attr-defined]
            mine = lora.adapter_state(model, name)
            # rename only the adapter part of each name (a group may be called like a module, e.g. "0")
            part = re.compile(rf"(\.lora_[A-Za-z_]+\.){re.escape(src)}\.")
            with torch.no_grad():
                for n, t in lora.adapter_state(model, src).items():
                    mine[part.sub(rf"\g<1>{name}.", n)].copy_(t)
        self.snapshots.append(step)
        while len(self.snapshots) > self.cfg.max_snapshots:
            old = self.snapshots.pop(0)
            for g in self.trainable:
                self._model(g).delete_adapter(self.adapter(old, g))
        return True

    # -- checkpoints ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, list[int]]:
        return {"snapshots": list(self.snapshots)}

    def save(self, folder: Path) -> None:
        """Write each kept snapshot's adapters in PEFT's format to ``folder/league/<step>/<group>/``."""
        for at in self.snapshots:
            for g in self.trainable:
                lora.save(self._model(g), self.adapter(at, g), folder / "league" / f"{at:06d}" / g)

    def load(self, folder: Path, state: Mapping[str, Any]) -> None:
        """Put back the snapshots a checkpoint folder holds (after the groups' own weights are loaded).

        Raises:
            ValueError: a snapshot's adapter folder is missing.
        """
        for at in list(self.snapshots):
            for g in self.trainable:
                self._model(g).delete_adapter(self.adapter(at, g))
        self.snapshots = []
        for at in state.get("snapshots", []):
            for g in self.trainable:
                where = folder / "league" / f"{int(at):06d}" / g
                if not (where / "adapter_config.json").is_file():
                    raise ValueError(f"checkpoint {folder} lists league snapshot {at} but has no {where}")
                lora.load(self._model(g), self._add(int(at), g), where)
            self.snapshots.append(int(at))

    # -- metrics ----------------------------------------------------------------------------------------------
    def metrics(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """``league/episodes/<opponent>`` (share of episodes), ``league/return/<opponent>`` (the learner
        seats' mean return against a non-self opponent) and ``league/snapshots``."""
        kinds: dict[str, int] = defaultdict(int)
        returns: dict[str, list[float]] = defaultdict(list)
        for t in trajectories:
            opp = set(t.opponents.values())
            name = next(iter(opp)) if opp else SELF
            kinds[name] += 1
            if opp:
                mine = [r for a, r in t.agent_rewards.items() if a not in t.opponents]
                if mine:
                    returns[name].append(float(np.mean(mine)))
        n = max(len(trajectories), 1)
        out = {f"league/episodes/{k}": v / n for k, v in kinds.items()}
        out.update({f"league/return/{k}": float(np.mean(v)) for k, v in returns.items()})
        out["league/snapshots"] = float(len(self.snapshots))
        return out
