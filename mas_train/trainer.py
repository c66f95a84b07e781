"""The training loop: rollout → scores → advantages → per-group update → weight sync → metrics → eval/checkpoint.

:func:`train` is the whole of ``mas-train`` after argument parsing: start-up checks (:mod:`mas_train.startup`),
model loading, the loop of :meth:`MultiGroupTrainer.fit`, the summary. One step
(:meth:`MultiGroupTrainer.train_step`) reads top to bottom:

1. the next ``tasks_per_step`` tasks, ``num_generations`` (G) episodes of each, collected in lock-step
   (:class:`~mas_train.rollout.RolloutCollector`);
2. each turn's score ``s = w_team·R + w_role·role_reward − c·invalid`` (the agent's ``reward_weights``; by
   default team 1, role 0: ``s = R − c·invalid``) and its advantage (:func:`~mas_train.advantages.compute_advantages`,
   Dr. MAS eq. 5 by default), computed over the whole batch before it is split by model group;
3. per model group: its samples and advantages to its worker's GRPO update
   (:meth:`~mas_train.hosting.worker.ModelGroupWorker.update`, which refuses samples of older weights and
   reports the weight version it trained at), then the weight sync to its generation backend;
4. the step's metrics (:mod:`mas_train.metrics` names them).

:meth:`MultiGroupTrainer.fit` adds the cadence: an evaluation before the first update (step 0) when
``eval_before_training``, every ``eval_steps`` and at the end; a checkpoint every ``save_steps`` and at the end
(before the final evaluation), keeping the newest ``save_total_limit``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from mas_envs.core import text_env
from mas_train.advantages import RoleBaseline, compute_advantages_with_stats
from mas_train.checkpoint import (
    TrainerState,
    load_trainer_state,
    prune_checkpoints,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from mas_train.episodes import EpisodeLog
from mas_train.eval import eval_sampling, evaluate, write_artifacts
from mas_train.league import make_league
from mas_train.lemma_stats import lemma_metrics, lld_metrics
from mas_train.metrics import diversity_metrics, rollout_metrics, update_metrics
from mas_train.progress import bar_text, eval_progress, off_the_clock
from mas_train.scoring import advantage_columns, turn_scores
from mas_train.task_pool import TaskPool, collect_step
from mas_train.tasks import TaskSampler

if TYPE_CHECKING:
    from mas_train.assemble import RunParts
    from mas_train.tracking import RunLogger

__all__ = ["MultiGroupTrainer"]


class MultiGroupTrainer:
    """Drives Dr. MAS training over every model group of a run.

    Args:
        parts: the run's parts (:func:`mas_train.assemble.assemble`: its resolved config, env factory and probe
            env, task sources, started pool and collector); :func:`mas_train.assemble.assemble_trainer` builds
            them and this trainer in one call. The trainer builds no collaborator of its own.

    Attributes:
        step: completed training steps.
        run_dir: where logs and checkpoints go.
        last_eval, first_eval: the latest evaluation's metrics and this run's first (step 0 when
            ``eval_before_training``).
    """

    def __init__(self, parts: RunParts) -> None:
        resolved = self.resolved = parts.resolved
        cfg = self.cfg = resolved.config
        self.env_factory = parts.env_factory
        self.penalty = float(text_env(parts.probe).invalid_action_penalty)
        self._eval_tasks = parts.eval_tasks
        # the step's tasks: in data order, or by recent solve rate (mas_train.task_pool)
        self.sampler: TaskSampler | TaskPool = (
            TaskPool(parts.train_tasks, cfg.seed, cfg.task_pool)
            if cfg.task_pool.enabled
            else TaskSampler(parts.train_tasks, seed=cfg.seed)
        )
        # advantage_mode rae: each agent's moving-average baseline, across steps (saved in checkpoints)
        self.role_baseline = RoleBaseline(cfg.advantage_rae_decay) if cfg.advantage_mode == "rae" else None
        self.pool = parts.pool
        # a game's opponents: self-play, frozen snapshots, scripted policies (saved in checkpoints)
        self.league = make_league(resolved, parts.probe, parts.pool) if cfg.league.enabled else None
        self.collector = parts.collector
        self.groups = list(resolved.model_groups)
        # the agents whose turns can reach a loss: the (model group, agent) cells dynamic sampling looks at
        self.trainable = [
            a for a, ra in resolved.agents.items() if resolved.model_groups[ra.model_group].trainable
        ]
        if cfg.log_agent_grad_norms is None:
            self.agent_grad_norms = all(self.pool.worker(g).num_parameters < 1e9 for g in self.groups)
        else:
            self.agent_grad_norms = bool(cfg.log_agent_grad_norms)
        self.step = 0
        self.run_dir = resolved.run_dir
        self.episodes = EpisodeLog(  # RUN/rollouts/: what the agents said (mas_train.episodes)
            self.run_dir / "rollouts",
            per_step=cfg.log_episodes,
            per_eval=cfg.log_eval_episodes,
            penalty=self.penalty,
            seed=cfg.seed,
        )
        self.last_checkpoint: Path | None = None
        self.last_eval: dict[str, float] = {}
        self.first_eval: dict[str, float] = {}
        # samples whose weight version the workers checked in this process's steps, and those refused as stale
        # (always 0 when a step returns: a stale sample raises); the end-of-run summary prints them
        self.samples_checked = self.stale_samples = 0

    # -- data -----------------------------------------------------------------------------------------------
    @property
    def eval_tasks(self) -> list[dict[str, object]]:
        """Evaluation rows (the parts' source, :func:`mas_train.tasks.eval_tasks` by default), cut to
        ``eval_num_tasks``."""
        rows = self._eval_tasks()
        return rows[: self.cfg.eval_num_tasks] if self.cfg.eval_num_tasks else rows

    # -- one step -------------------------------------------------------------------------------------------
    def train_step(self) -> tuple[dict[str, float], dict[str, object]]:
        """Run one training step (see the module docstring).

        Returns:
            ``(metrics, extra)``: flat float metrics and JSON-able extras (``tasks``: the task ids of the step).
        """

        cfg = self.cfg
        t_start = time.perf_counter()
        weights = {a: ra.reward_weights for a, ra in self.resolved.agents.items()}
        got = collect_step(
            self.collector,
            self.sampler,
            tasks_per_step=cfg.tasks_per_step,
            num_generations=cfg.num_generations,
            step=self.step,
            score=lambda smp: turn_scores(smp, self.penalty, weights),
            trainable_agents=self.trainable,
            dynamic=cfg.dynamic_sampling,
            league=self.league,
        )
        batch, tasks = got.batch, got.rows
        t_rollout = time.perf_counter() - t_start

        t0 = time.perf_counter()
        samples = batch.samples
        metrics = rollout_metrics(got.generated, self.penalty)
        metrics.update(got.metrics)
        metrics.update(diversity_metrics(samples))  # has an agent's G samples collapsed onto one answer?
        if self.league is not None:
            metrics.update(self.league.metrics(got.generated.trajectories))
        adv = np.zeros(0)
        if samples:
            columns = advantage_columns(samples, batch.trajectories, self.penalty, weights)
            res = compute_advantages_with_stats(
                *columns,
                mode=cfg.advantage_mode,
                eps=cfg.advantage_eps,
                scope=cfg.advantage_scope,
                turn_ids=[s.turn for s in samples],
                min_turn_samples=cfg.advantage_turn_min_samples,
                stats=cfg.advantage_stats,
                baseline=self.role_baseline,
            )
            adv = res.advantages
            metrics.update(res.metrics(prefix="charts/advantage"))
            # the update's work: prompt + completion tokens of the trainable turns that reach a loss (A != 0)
            metrics["sampling/update_tokens"] = float(
                sum(
                    len(s.prompt_ids) + len(s.completion_ids)
                    for s, a in zip(samples, adv, strict=True)
                    if a != 0 and s.agent in self.trainable
                )
            )
            # Lemma 4.2's inflation factor and noise share of every agent, whatever advantage_mode trains
            # (docs/training.md), and the LLD probe: the likelihood of the turns that succeeded.
            metrics.update(lemma_metrics(*columns))
            metrics.update(
                lld_metrics(columns[3], [s.success for s in samples], [s.sampling_logprobs for s in samples])
            )
        t_score = time.perf_counter() - t0

        t_update = t_sync = 0.0
        trained_at: dict[str, int] = {}  # group -> the weight version its update trained at
        for g in self.groups:
            if not self.resolved.model_groups[g].trainable:
                # a frozen group acts and is logged, but its samples never reach a loss
                for k, v in self.pool.worker(g).usage.items():
                    metrics[f"charts/backend/{k}/{g}"] = float(v)
                continue
            idx = [i for i, s in enumerate(samples) if s.model_group == g]
            if not idx:
                # None of this group's agents acted (e.g. every episode ended before its turn): nothing to learn.
                metrics[f"charts/skipped/{g}"] = 1.0
                continue
            worker = self.pool.worker(g)
            t0 = time.perf_counter()
            out = worker.update(
                [samples[i] for i in idx],
                [float(adv[i]) for i in idx],
                agent_grad_norms=self.agent_grad_norms,
            )
            t_update += time.perf_counter() - t0
            t0 = time.perf_counter()
            worker.sync_weights()
            t_sync += time.perf_counter() - t0
            metrics[f"charts/skipped/{g}"] = 0.0
            metrics.update(update_metrics(g, out))
            trained_at[g] = int(out["weights/trained_at_version"])
            self.samples_checked += int(out["weights/samples_checked"])
            self.stale_samples += int(out["weights/stale_samples"])
        self.step += 1
        if self.league is not None:
            self.league.after_step(self.step)  # a snapshot of the weights just synced, when one is due
        self.episodes.train(self.step, batch, adv.tolist(), trained_at)
        metrics.update(
            {
                "time/generate": batch.generate_seconds,
                "time/env": batch.env_seconds,
                "time/rollout": t_rollout,
                "time/score": t_score,
                "time/update": t_update,
                "time/sync": t_sync,
                "time/step": time.perf_counter() - t_start,
            }
        )
        return metrics, {"tasks": [str(t.get("id", "")) for t in tasks]}

    # -- evaluation -----------------------------------------------------------------------------------------
    def evaluate(self, progress: bool = False) -> dict[str, float]:
        """avg@k / pass@k per data source on the eval tasks (``eval/…`` metrics; see :mod:`mas_train.eval`),
        and the env's exact evaluation where it has one (its artifacts to
        ``RUN/evals/<name>_step-<NNNNNN>.json``); ``progress``: a bar over the tasks."""
        tasks, k = self.eval_tasks, self.cfg.eval_k
        rec = self.episodes.eval_recorder(k, self.step)
        with eval_progress(len(tasks), k, progress) as tick:
            result = evaluate(
                self.collector,
                tasks,
                k=k,
                sampling=eval_sampling(self.resolved),
                tasks_per_batch=self.cfg.eval_tasks_per_batch,
                progress=tick,
                on_batch=rec.add if rec else None,
                # an env's exact evaluation (Kuhn poker's policy table): RUN/evals/<name>_step-<NNNNNN>.json
                on_exact=lambda found: write_artifacts(
                    found, self.run_dir / "evals", suffix=f"_step-{self.step:06d}"
                ),
                opponents=self.cfg.eval_opponents,
            )
        self.episodes.write_eval(rec)
        self.last_eval = result
        if not self.first_eval:
            self.first_eval = result
        return result

    # -- checkpoints ----------------------------------------------------------------------------------------
    def state_dict(self) -> TrainerState:

        state: TrainerState = {
            "step": self.step,
            "sampler": dict(self.sampler.state_dict()),
            "rng": rng_state(),
            "run_name": self.resolved.run_name,
            "groups": self.groups,
        }
        if self.role_baseline is not None:
            state["role_baseline"] = self.role_baseline.state_dict()
        if self.league is not None:
            state["league"] = self.league.state_dict()
        return state

    def save_checkpoint(self) -> Path:
        """Write ``<run_dir>/checkpoints/step-<step>`` (see :mod:`mas_train.checkpoint`) and delete checkpoints
        beyond ``save_total_limit``."""

        self.last_checkpoint = save_checkpoint(
            self.run_dir,
            self.step,
            self.pool,
            self.state_dict(),
            self.cfg.to_yaml(),
            extra=self.league.save if self.league is not None else None,
        )
        prune_checkpoints(self.run_dir, self.cfg.save_total_limit)
        return self.last_checkpoint

    def load_checkpoint(self, ckpt: str | Path) -> None:
        """Continue from a checkpoint: weights, optimizers, schedulers, data position, RNG, step.

        Raises:
            ValueError: the checkpoint's model groups or data order differ from this run's.
        """

        ckpt = Path(ckpt)
        state = load_trainer_state(ckpt)
        if list(state["groups"]) != self.groups:
            raise ValueError(
                f"checkpoint {ckpt} has model groups {state['groups']} but this run has {self.groups}; resume with "
                "the same model_sharing and agents settings"
            )
        if isinstance(self.sampler, TaskPool) != ("order" in state["sampler"]):
            raise ValueError(
                f"checkpoint {ckpt} was saved with task_pool.enabled {not isinstance(self.sampler, TaskPool)}; "
                "resume with the same task_pool setting"
            )
        if self.role_baseline is not None:
            if "role_baseline" not in state:
                raise ValueError(
                    f"checkpoint {ckpt} has no RAE baseline (it was saved with another advantage_mode), so "
                    "advantage_mode rae cannot continue it exactly; resume with the checkpoint's advantage_mode"
                )
            self.role_baseline.load_state_dict(state["role_baseline"])
        if self.league is not None and "league" not in state:
            raise ValueError(
                f"checkpoint {ckpt} has no league (it was saved with league.enabled false); resume with that setting"
            )
        for g in self.groups:
            self.pool.worker(g).load(str(ckpt / "groups" / g))
        if self.league is not None:
            self.league.load(ckpt, state["league"])
        self.sampler.load_state_dict(state["sampler"])  # type: ignore[arg-type]
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.last_checkpoint = ckpt

    # -- the loop -------------------------------------------------------------------------------------------
    def fit(
        self,
        logger: RunLogger,
        *,
        progress: bool = True,
        say: Callable[[str], None] = print,
        live_bar: bool = True,
    ) -> dict[str, float]:
        """Train to ``max_steps`` with the evaluation and checkpoint cadence of the module docstring.

        Args:
            logger: a :class:`~mas_train.tracking.RunLogger` (``log(step, metrics, extra)``).
            progress: show progress: a tqdm bar when ``live_bar``, else one ``say`` line per logged step.
            say: prints a status line (kept clear of the bar).
            live_bar: the bar's stream is a terminal. In a log file a bar redrawn around status lines and at
                close would leave one copy per redraw, so there each logged step is one line instead.

        Returns:
            The last training step's metrics.
        """

        cfg = self.cfg
        agents = list(self.resolved.agents)
        self.episodes.text_sink = getattr(logger, "log_text", None)
        evaluate = bool(cfg.eval_steps)
        start_step = self.step
        if evaluate and self.step == 0 and cfg.eval_before_training:
            say(f"  evaluating on {len(self.eval_tasks)} tasks × k={cfg.eval_k} before training (step 0)…")
            logger.log(0, self.evaluate(progress and live_bar))
        last: dict[str, float] = {}
        saved_at = evaluated_at = -1
        bar = tqdm(
            total=cfg.max_steps,
            initial=self.step,
            desc="mas-train",
            unit="step",
            disable=not (progress and live_bar),
            dynamic_ncols=True,
        )
        try:
            while self.step < cfg.max_steps:
                last, extra = self.train_step()
                if self.step % cfg.logging_steps == 0 or self.step == cfg.max_steps:
                    logger.log(self.step, last, extra)
                bar.set_postfix_str(bar_text(last, agents), refresh=False)
                bar.update(1)
                if (
                    progress
                    and not live_bar
                    and (self.step % cfg.logging_steps == 0 or self.step == cfg.max_steps)
                ):
                    say(
                        f"  step {self.step}/{cfg.max_steps}: {bar_text(last, agents)} ({last['time/step']:.1f} s)"
                    )
                # the last step saves before its evaluation, so a run killed there resumes into that evaluation
                if (cfg.save_steps and self.step % cfg.save_steps == 0) or self.step == cfg.max_steps:
                    with off_the_clock(bar):
                        say(f"  saving checkpoint step-{self.step:06d}…")
                        self.save_checkpoint()
                    saved_at = self.step
                if evaluate and self.step % cfg.eval_steps == 0:
                    with off_the_clock(bar):
                        say(
                            f"  evaluating on {len(self.eval_tasks)} tasks × k={cfg.eval_k} at step {self.step}…"
                        )
                        logger.log(self.step, self.evaluate(progress and live_bar))
                    evaluated_at = self.step
        finally:
            bar.close()
        if self.step > start_step and saved_at != self.step:
            say(f"  saving checkpoint step-{self.step:06d}…")
            self.save_checkpoint()
        if evaluate and evaluated_at != self.step:
            say(f"  evaluating on {len(self.eval_tasks)} tasks × k={cfg.eval_k} at step {self.step}…")
            logger.log(self.step, self.evaluate(progress and live_bar))
        return last

    def close(self) -> None:
        self.collector.close()
        self.pool.shutdown()
