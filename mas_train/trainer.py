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
   (:meth:`~mas_train.worker.ModelGroupWorker.update`), then the weight sync to its generation backend;
4. the step's metrics (:mod:`mas_train.metrics` names them).

:meth:`MultiGroupTrainer.fit` adds the cadence: an evaluation before the first update (step 0) when
``eval_before_training``, every ``eval_steps`` and at the end; a checkpoint every ``save_steps`` and at the end,
keeping the newest ``save_total_limit``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["MultiGroupTrainer", "train"]


class MultiGroupTrainer:
    """Drives Dr. MAS training over every model group of a run.

    Args:
        resolved: the run's :class:`~mas_train.config.ResolvedConfig` (``TrainConfig.resolve``).
        pool: a started or unstarted worker pool (default: :func:`mas_train.pools.make_pool`).
        env_factory: zero-argument env constructor (default: ``mas_envs.make(config.env, **env kwargs)``).
        train_tasks: task rows (default: :func:`mas_train.tasks.train_tasks`).
        eval_tasks: evaluation rows (default: :func:`mas_train.tasks.eval_tasks`, read on first use).
        probe: an env already made by ``env_factory`` (the start-up checks' one); made here when not given.

    Attributes:
        step: completed training steps.
        run_dir: where logs and checkpoints go.
        last_eval, first_eval: the latest evaluation's metrics and this run's first (step 0 when
            ``eval_before_training``).
    """

    def __init__(
        self,
        resolved,
        *,
        pool=None,
        env_factory: Callable[[], Any] | None = None,
        train_tasks: Sequence[Mapping[str, Any]] | None = None,
        eval_tasks: Sequence[Mapping[str, Any]] | None = None,
        probe: Any = None,
    ) -> None:
        from mas_train.pools import make_pool
        from mas_train.rollout import RolloutCollector
        from mas_train.startup import make_env_factory
        from mas_train.tasks import TaskSampler
        from mas_train.tasks import train_tasks as default_train_tasks

        self.resolved = resolved
        cfg = self.cfg = resolved.config
        self.env_factory = env_factory or make_env_factory(cfg)
        self._probe = probe if probe is not None else self.env_factory()
        self.penalty = float(self._probe.unwrapped.invalid_action_penalty)
        if train_tasks is None:
            train_tasks = default_train_tasks(cfg, self._probe)
        self._eval_tasks = list(eval_tasks) if eval_tasks is not None else None
        self.sampler = TaskSampler(train_tasks, seed=cfg.seed)
        self.pool = pool if pool is not None else make_pool(resolved)
        self.pool.start()
        self.groups = list(resolved.model_groups)
        if cfg.log_agent_grad_norms is None:
            self.agent_grad_norms = all(self.pool.worker(g).num_parameters < 1e9 for g in self.groups)
        else:
            self.agent_grad_norms = bool(cfg.log_agent_grad_norms)
        self.collector = RolloutCollector(
            self.env_factory,
            generators={g: self.pool.worker(g) for g in self.groups},
            tokenizers={g: self.pool.tokenizer(g) for g in self.groups},
            agent_groups=resolved.agent_to_group,
            sampling={a: ra.sampling_params() for a, ra in resolved.agents.items()},
            max_prompt_length=cfg.max_prompt_length,
            seed=cfg.seed,
        )
        self.step = 0
        self.run_dir = resolved.run_dir
        self.last_checkpoint: Path | None = None
        self.last_eval: dict[str, float] = {}
        self.first_eval: dict[str, float] = {}

    # -- data -----------------------------------------------------------------------------------------------
    @property
    def eval_tasks(self) -> list[dict[str, Any]]:
        """Evaluation rows (see :func:`mas_train.tasks.eval_tasks`), cut to ``eval_num_tasks``."""
        if self._eval_tasks is None:
            from mas_train.tasks import eval_tasks

            self._eval_tasks = eval_tasks(self.cfg, self._probe, limit=self.cfg.eval_num_tasks)
        return self._eval_tasks[: self.cfg.eval_num_tasks] if self.cfg.eval_num_tasks else self._eval_tasks

    # -- one step -------------------------------------------------------------------------------------------
    def train_step(self) -> tuple[dict[str, float], dict[str, Any]]:
        """Run one training step (see the module docstring).

        Returns:
            ``(metrics, extra)``: flat float metrics and JSON-able extras (``tasks``: the task ids of the step).
        """
        from mas_train.advantages import compute_advantages_with_stats, lemma_metrics
        from mas_train.metrics import rollout_metrics, update_metrics
        from mas_train.scoring import turn_scores

        cfg = self.cfg
        t_start = time.perf_counter()
        tasks = self.sampler.next(cfg.tasks_per_step)
        batch = self.collector.collect(tasks, cfg.num_generations, step=self.step, uid_prefix=f"{self.step}/")
        t_rollout = time.perf_counter() - t_start

        t0 = time.perf_counter()
        samples = batch.samples
        metrics = rollout_metrics(batch, self.penalty)
        adv = np.zeros(0)
        if samples:
            weights = {a: ra.reward_weights for a, ra in self.resolved.agents.items()}
            columns = (
                turn_scores(samples, self.penalty, weights),
                [s.task_uid for s in samples],
                [s.traj_uid for s in samples],
                [s.agent for s in samples],
            )
            res = compute_advantages_with_stats(
                *columns,
                mode=cfg.advantage_mode,
                eps=cfg.advantage_eps,
                scope=cfg.advantage_scope,
                turn_ids=[s.turn for s in samples],
                min_turn_samples=cfg.advantage_turn_min_samples,
            )
            adv = res.advantages
            metrics.update(res.metrics(prefix="charts/advantage"))
            # Lemma 4.2's inflation factor of every agent, whatever advantage_mode trains (docs/training.md).
            metrics.update(lemma_metrics(*columns))
        t_score = time.perf_counter() - t0

        t_update = t_sync = 0.0
        for g in self.groups:
            if not self.resolved.model_groups[g].trainable:
                # a frozen group acts and is logged, but its samples never reach a loss
                for k, v in getattr(self.pool.worker(g), "usage", {}).items():
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
        self.step += 1
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
    def evaluate(self) -> dict[str, float]:
        """avg@k / pass@k per data source on the eval tasks (``eval/…`` metrics; see :mod:`mas_train.eval`)."""
        from mas_train.eval import eval_sampling, evaluate

        result = evaluate(
            self.collector, self.eval_tasks, k=self.cfg.eval_k, sampling=eval_sampling(self.resolved)
        )
        self.last_eval = result
        if not self.first_eval:
            self.first_eval = result
        return result

    # -- checkpoints ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        from mas_train.checkpoint import rng_state

        return {
            "step": self.step,
            "sampler": self.sampler.state_dict(),
            "rng": rng_state(),
            "run_name": self.resolved.run_name,
            "groups": self.groups,
        }

    def save_checkpoint(self) -> Path:
        """Write ``<run_dir>/checkpoints/step-<step>`` (see :mod:`mas_train.checkpoint`) and delete checkpoints
        beyond ``save_total_limit``."""
        from mas_train.checkpoint import prune_checkpoints, save_checkpoint

        self.last_checkpoint = save_checkpoint(
            self.run_dir, self.step, self.pool, self.state_dict(), self.cfg.to_yaml()
        )
        prune_checkpoints(self.run_dir, self.cfg.save_total_limit)
        return self.last_checkpoint

    def load_checkpoint(self, ckpt: str | Path) -> None:
        """Continue from a checkpoint: weights, optimizers, schedulers, data position, RNG, step.

        Raises:
            ValueError: the checkpoint's model groups or data order differ from this run's.
        """
        from mas_train.checkpoint import load_trainer_state, set_rng_state

        ckpt = Path(ckpt)
        state = load_trainer_state(ckpt)
        if list(state["groups"]) != self.groups:
            raise ValueError(
                f"checkpoint {ckpt} has model groups {state['groups']} but this run has {self.groups}; resume with "
                "the same model_sharing and agents settings"
            )
        for g in self.groups:
            self.pool.worker(g).load(str(ckpt / "groups" / g))
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.last_checkpoint = ckpt

    # -- the loop -------------------------------------------------------------------------------------------
    def fit(
        self, logger: Any, *, progress: bool = True, say: Callable[[str], None] = print
    ) -> dict[str, float]:
        """Train to ``max_steps`` with the evaluation and checkpoint cadence of the module docstring.

        Args:
            logger: a :class:`~mas_train.tracking.RunLogger` (``log(step, metrics, extra)``).
            progress: show a tqdm bar.
            say: prints a status line (kept clear of the bar).

        Returns:
            The last training step's metrics.
        """
        from tqdm.auto import tqdm

        from mas_train.progress import bar_text, off_the_clock

        cfg = self.cfg
        agents = list(self.resolved.agents)
        evaluate = bool(cfg.eval_steps)
        start_step = self.step
        if evaluate and self.step == 0 and cfg.eval_before_training:
            say(f"  evaluating on {len(self.eval_tasks)} tasks × k={cfg.eval_k} before training (step 0)…")
            logger.log(0, self.evaluate())
        last: dict[str, float] = {}
        saved_at = evaluated_at = -1
        bar = tqdm(
            total=cfg.max_steps,
            initial=self.step,
            desc="mas-train",
            unit="step",
            disable=not progress,
            dynamic_ncols=True,
        )
        try:
            while self.step < cfg.max_steps:
                last, extra = self.train_step()
                if self.step % cfg.logging_steps == 0 or self.step == cfg.max_steps:
                    logger.log(self.step, last, extra)
                bar.set_postfix_str(bar_text(last, agents), refresh=False)
                bar.update(1)
                if cfg.save_steps and self.step % cfg.save_steps == 0:
                    with off_the_clock(bar):
                        say(f"  saving checkpoint step-{self.step:06d}…")
                        self.save_checkpoint()
                    saved_at = self.step
                if evaluate and self.step % cfg.eval_steps == 0:
                    with off_the_clock(bar):
                        say(
                            f"  evaluating on {len(self.eval_tasks)} tasks × k={cfg.eval_k} at step {self.step}…"
                        )
                        logger.log(self.step, self.evaluate())
                    evaluated_at = self.step
        finally:
            bar.close()
        if self.step > start_step and saved_at != self.step:
            say(f"  saving checkpoint step-{self.step:06d}…")
            self.save_checkpoint()
        if evaluate and evaluated_at != self.step:
            say(f"  evaluating on {len(self.eval_tasks)} tasks × k={cfg.eval_k} at step {self.step}…")
            logger.log(self.step, self.evaluate())
        return last

    def close(self) -> None:
        self.collector.close()
        self.pool.shutdown()


def _first_eval_of(run_dir: Path) -> dict[str, float]:
    """The first evaluation line of a run's ``metrics.jsonl`` (a resumed run's "before")."""
    from mas_train.tracking import read_jsonl

    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    for rec in read_jsonl(path):
        ev = {k: v for k, v in rec.items() if k.startswith("eval/")}
        if ev:
            return ev
    return {}


def train(
    cfg, *, progress: bool = True, out=None, env_factory: Callable[[], Any] | None = None
) -> dict[str, Any]:
    """Train ``cfg`` (a :class:`~mas_train.config.TrainConfig`) to ``max_steps``: the body of ``mas-train``.

    Returns:
        A summary: ``run_dir``, ``metrics_file``, ``tensorboard_dir``, ``checkpoint``, ``steps``,
        ``wall_seconds``, ``last`` (last step's metrics), ``eval`` (last evaluation), ``first_eval`` (the run's
        first evaluation, step 0 when ``eval_before_training``), ``plots`` (PNG paths), ``already_complete``
        (``True`` when ``--resume`` pointed at a checkpoint at or past ``max_steps``: nothing was run or written).

    Raises:
        ConfigError: invalid settings, found before any model is loaded.
        FileNotFoundError: ``--resume`` target not found.
    """
    from tqdm.auto import tqdm

    from mas_train.checkpoint import list_checkpoints, load_trainer_state
    from mas_train.config import LAPTOP_DEFAULTS
    from mas_train.progress import print_summary
    from mas_train.startup import prepare, record_config
    from mas_train.tracking import RunLogger

    out = out or sys.stdout
    t_start = time.perf_counter()
    plan = prepare(cfg, env_factory=env_factory)
    cfg, resolved, run_dir, ckpt = plan.config, plan.resolved, plan.run_dir, plan.checkpoint
    summary: dict[str, Any] = {
        "run_dir": str(run_dir),
        "metrics_file": str(run_dir / "metrics.jsonl") if "jsonl" in cfg.report_to else None,
        "tensorboard_dir": str(run_dir / "tb") if "tensorboard" in cfg.report_to else None,
        "checkpoint": str(ckpt) if ckpt else None,
        "steps": 0,
        "last": {},
        "eval": {},
        "first_eval": {},
        "plots": [],
        "already_complete": False,
    }
    if ckpt is not None:
        step = int(load_trainer_state(ckpt)["step"])
        if step >= cfg.max_steps:
            print(
                f"mas-train: run {run_dir} is already complete at step {step} (max_steps {cfg.max_steps}); "
                "raise --max_steps to train further",
                file=out,
            )
            out.flush()
            return {
                **summary,
                "steps": step,
                "wall_seconds": time.perf_counter() - t_start,
                "already_complete": True,
            }

    agents = list(resolved.agents)
    print(f"mas-train: env {cfg.env} | agents {', '.join(agents)} | run {run_dir}", file=out)
    for g in resolved.model_groups.values():
        how = "LoRA adapter" if g.lora else "all weights"
        what = (
            f"trains {', '.join(g.agents)} ({how})" if g.trainable else f"samples for {', '.join(g.agents)}"
        )
        print(f"  model group {g.name!r}: {g.model} ({g.backend}) {what}", file=out)
    print(
        f"  {cfg.max_steps} steps x {cfg.tasks_per_step} tasks x G={cfg.num_generations}, "
        f"advantage_mode={cfg.advantage_mode}, lr {cfg.learning_rate:g}",
        file=out,
    )
    print(
        f"  tasks: {cfg.train_data or 'the env default'}; eval: {cfg.eval_data or 'the env default'}",
        file=out,
    )
    if cfg.train_data is not None and cfg.train_data == LAPTOP_DEFAULTS.get(cfg.env, {}).get("train_data"):
        print(
            "  (the laptop setting of a plain run: mas_train/config/common.py LAPTOP_DEFAULTS; name tasks, e.g. "
            "--train_data gsm8k-train, or a model for the paper's prompts and data)",
            file=out,
        )
    for k, (old, new) in plan.changes.items():
        print(f"  resumed with {k} changed: {old!r} -> {new!r}", file=out)
    for w in plan.warnings:
        print(f"  warning: {w}", file=out)
    out.flush()

    def say(msg: str) -> None:
        # tqdm.write clears and redraws the bar around the line, so status lines never break it.
        tqdm.write(msg, file=out)
        out.flush()

    t0 = time.perf_counter()
    say("  loading models…")
    trainer = MultiGroupTrainer(
        resolved,
        env_factory=plan.env_factory,
        train_tasks=plan.train_tasks,
        eval_tasks=plan.eval_tasks,
        probe=plan.probe,
    )
    try:
        if ckpt is not None:
            say(f"  loading checkpoint {ckpt.name}…")
            trainer.load_checkpoint(ckpt)
            print(f"  resumed from {ckpt} at step {trainer.step}", file=out)
            trainer.first_eval = _first_eval_of(run_dir)
        say(
            f"  ready in {time.perf_counter() - t0:.1f} s; step {trainer.step + 1} starts with the first rollout"
        )
        record_config(plan, trainer.step)
        logger = RunLogger(
            run_dir,
            cfg.report_to,
            run_name=resolved.run_name,
            config=cfg.to_dict(),
            resume_step=trainer.step if ckpt is not None else None,
        )
        try:
            summary["last"] = trainer.fit(logger, progress=progress, say=say)
        finally:
            logger.close()
    finally:
        trainer.close()
    ckpts = list_checkpoints(run_dir)
    summary.update(
        checkpoint=str(ckpts[-1]) if ckpts else None,
        steps=trainer.step,
        eval=trainer.last_eval,
        first_eval=trainer.first_eval,
        plots=[str(p) for p in _plots(run_dir, cfg)],
        wall_seconds=time.perf_counter() - t_start,
    )
    print_summary(summary, out)
    return summary


def _plots(run_dir: Path, cfg: Any) -> list[Path]:
    """Draw the run's plots into ``run_dir/plots`` when its metrics were written as JSONL."""
    if "jsonl" not in cfg.report_to:
        return []
    try:
        from mas_train.plots import plot_run
    except ImportError:  # matplotlib is part of the train extra; a trimmed install just skips the pictures
        return []
    return list(plot_run(run_dir, run_dir / "plots"))
