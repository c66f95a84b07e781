"""mas-compare: the report from fake run folders (exact numbers), and a tiny end-to-end comparison."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from _fake_runs import write_fake_run

from mas_train.tools.compare import (
    build_report,
    count_spikes,
    is_finished,
    main,
    run_comparison,
    spearman,
    summarize_run,
)

SPIKY = [1, 1, 5, 1, 3, 1, 1, 9, 1, 1, 1, 1]  # spikes at steps 3 and 8; 3.0 is not > 3 x median 1


def test_count_spikes_uses_the_previous_ten_steps():
    assert count_spikes(SPIKY) == 2
    # steps 13-17 (10 after ones) spike; at step 18 the window is 5 ones + 5 tens (median 5.5); 25 at step 19
    # is not a spike over the previous ten (median 10) though it would be over all eighteen (median 1)
    assert count_spikes([1] * 12 + [10] * 6 + [25]) == 5
    assert count_spikes([]) == 0 and count_spikes([100.0]) == 0


def test_summarize_run_exact_numbers(tmp_path):
    run = write_fake_run(
        tmp_path / "r",
        mode="grpo",
        seed=3,
        grad_norms={"solver": SPIKY},
        evals=((0, 0.25, 0.5), (12, 0.625, 0.75)),
        factor={"solver": 2.0},
    )
    s = summarize_run(run)
    assert (s.mode, s.seed, s.k) == ("grpo", 3, 4)
    assert (s.final_avg, s.final_pass, s.gain_avg) == (0.625, 0.75, 0.375)
    g = s.grad["solver"]
    # sorted: nine 1s, 3, 5, 9 -> median 1; p95 at rank 10.45 -> 5 + 0.45 * 4 = 6.8
    assert g == {"median": 1.0, "p95": pytest.approx(6.8), "max": 9.0, "spikes": 2.0, "steps": 12.0}
    assert s.factor["solver"] == pytest.approx(2.0 + 0.01 * np.mean(range(12)))


def _fake_grid(root, diagnostics=False):
    dirs = []
    for mode, norms, evals in [
        ("grpo", SPIKY, [((0, 0.25, 0.5), (12, 0.5, 0.75)), ((0, 0.25, 0.5), (12, 0.25, 0.5))]),
        ("drmas", [1.0] * 12, [((0, 0.25, 0.5), (12, 0.75, 1.0)), ((0, 0.25, 0.5), (12, 0.5, 1.0))]),
    ]:
        for seed, ev in enumerate(evals):
            grads = {"solver": norms, "verifier": [2.0] * 12}
            dirs.append(
                write_fake_run(
                    root / f"{mode}{seed}",
                    mode=mode,
                    seed=seed,
                    grad_norms=grads,
                    evals=ev,
                    diagnostics=diagnostics,
                )
            )
    return dirs


def test_report_from_fake_runs(tmp_path):
    out = tmp_path / "report"
    summary = build_report(_fake_grid(tmp_path, diagnostics=True), out)
    grpo, drmas = summary["modes"]["grpo"], summary["modes"]["drmas"]
    assert grpo["seeds"] == [0, 1] and grpo["k"] == 4
    assert grpo["final_avg"]["mean"] == pytest.approx(0.375)
    assert grpo["final_avg"]["std"] == pytest.approx(np.std([0.5, 0.25], ddof=1))
    assert grpo["gain_avg"]["values"] == [0.25, 0.0]
    assert drmas["gain_avg"]["mean"] == pytest.approx(0.375) and drmas["final_pass"]["mean"] == 1.0
    assert (
        grpo["grad"]["solver"]["spikes"]["mean"] == 2.0 and drmas["grad"]["solver"]["spikes"]["mean"] == 0.0
    )
    assert grpo["grad"]["solver"]["median"]["mean"] == 1.0 and grpo["grad"]["solver"]["max"]["std"] == 0.0
    assert grpo["factor"]["verifier"]["mean"] == pytest.approx(1.5 + 0.055)
    assert (
        json.loads((out / "summary.json").read_text())["modes"]["grpo"]["grad"]["solver"]["spikes"]["mean"]
        == 2
    )
    md = (out / "summary.md").read_text()
    assert "| grpo | 0,1 | 0.375 ± 0.177 (k=4) | 0.625 ± 0.177 | 0.125 ± 0.177 |" in md
    # zero-std 0.25, factor 1.055, noise share 0.11, mean advantage 0 (solver) / -0.1 (verifier), all over 12 steps
    assert (
        "| grpo | solver | 1.000 ± 0.000 | 6.800 ± 0.000 | 9.000 ± 0.000 | 2.0 ± 0.0 | 0.250 ± 0.000 "
        "| 1.055 ± 0.000 | 0.110 ± 0.000 | 0.000 ± 0.000 |" in md
    )
    assert grpo["adv_mean"]["verifier"]["mean"] == pytest.approx(-0.1)
    assert grpo["zero_std"]["verifier"]["values"] == [0.25, 0.25]
    # LLD: -1 - 0.1 i; steps 1-3 average -1.1, steps 10-12 average -2.0
    assert drmas["lld"]["solver"]["first"]["mean"] == pytest.approx(-1.1)
    assert drmas["lld"]["solver"]["change"]["mean"] == pytest.approx(-0.9)
    assert "| drmas | verifier | -1.100 ± 0.000 | -2.000 ± 0.000 | -0.900 ± 0.000 |" in md
    for name in [
        "reward.png",
        "grad_norm_solver.png",
        "grad_norm_verifier.png",
        "lemma_factor.png",
        "noise_share.png",
        "lld.png",
        "factor_vs_norm.png",
    ]:
        assert (out / name).read_bytes().startswith(b"\x89PNG") and f"]({name})" in md
    # drmas, pooled over 2 seeds x 2 agents x 12 steps: the 24 solver points (factor 1.00..1.11, norm 1) all rank
    # below the 24 verifier points (1.50..1.61, norm 2). Factor ranks are 1.5, 3.5, ..., 47.5 (each twice; 24
    # values spaced 2, population variance 4 * (24**2 - 1) / 12), the norm ranks two-valued: the point-biserial
    # r = (36.5 - 12.5) * sqrt(0.5 * 0.5) / sqrt(variance)
    rho = drmas["factor_norm_spearman"]
    assert rho["points"] == 48 and rho["rho"] == pytest.approx(12 / math.sqrt(4 * 575 / 12))
    assert summary["ranking"] == ["grpo", "drmas"]
    assert "Modes by mean final avg@k, lowest first: grpo < drmas." in md
    assert f"| drmas | all (pooled) | {rho['rho']:.2f} | 48 |" in md
    # per agent: the solver's norms are all 1 (constant: no rho); the verifier's are all 2 as well
    assert drmas["factor_norm_spearman_by_agent"]["solver"] == {"rho": None, "points": 24}
    assert "| drmas | solver | – | 24 |" in md
    # grpo's solver alone: its 2 x 12 points (factor 1 + 0.01 i, the spiky norms) pooled over the two seeds
    per = grpo["factor_norm_spearman_by_agent"]["solver"]
    assert per["points"] == 24
    assert per["rho"] == pytest.approx(spearman([1 + 0.01 * i for i in range(12)] * 2, SPIKY * 2))


def test_a_tie_is_written_as_a_tie(tmp_path):
    # Regression: two modes with the same mean final avg@k were written "drmas < grpo".
    ev = ((0, 0.25, 0.5), (12, 0.5, 0.75))
    dirs = [write_fake_run(tmp_path / m, mode=m, evals=ev) for m in ("grpo", "drmas", "agent_mean")]
    write_fake_run(dirs[2], mode="agent_mean", evals=((0, 0.25, 0.5), (12, 0.25, 0.5)))
    summary = build_report(dirs, tmp_path / "report")
    assert summary["ranking"] == ["agent_mean", "drmas", "grpo"]
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "Modes by mean final avg@k, lowest first: agent_mean < drmas = grpo." in md


def test_spearman_hand_values():
    # d = ranks(x) - ranks(y) = (0, 1, -1, 0): rho = 1 - 6 * 2 / (4 * (16 - 1)) = 0.8
    assert spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)
    # tied x: ranks (1.5, 1.5, 3) vs (1, 2, 3): cov 1.5, var 1.5 and 2 -> 1.5 / sqrt(3)
    assert spearman([5, 5, 7], [1, 2, 3]) == pytest.approx(1.5 / math.sqrt(3))
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None
    with pytest.raises(ValueError, match="equal length"):
        spearman([1, 2, 3], [1, 2])


def test_report_errors(tmp_path, capsys):
    assert main(["--runs", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "config.yaml not found" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no run folders"):
        build_report([], tmp_path)


def test_run_comparison_skips_finished_and_refuses_reserved_flags(tmp_path):
    from mas_train.config import ConfigError

    calls = []

    def fake_train(cfg):
        calls.append((cfg.advantage_mode, cfg.seed, cfg.resume))
        run_dir = tmp_path / "cmp" / "runs" / cfg.run_name
        write_fake_run(run_dir, mode=cfg.advantage_mode, seed=cfg.seed, steps=2, evals=((0, 0, 0), (2, 1, 1)))
        cfg.to_yaml(run_dir / "config.yaml")  # as mas-train writes it
        (run_dir / "checkpoints" / "step-000002").mkdir(parents=True)
        (run_dir / "checkpoints" / "step-000002" / "trainer_state.pt").write_bytes(b"")
        return {"run_dir": str(run_dir)}

    flags = ["--env", "math-2agent", "--max_steps", "2", "--eval_steps", "2"]
    dirs, trained = run_comparison(
        flags, ["drmas", "grpo"], [0], tmp_path / "cmp", train_fn=fake_train, log=str
    )
    assert calls == [("drmas", 0, None), ("grpo", 0, None)] and trained == dirs
    assert [d.name for d in dirs] == ["drmas__seed0", "grpo__seed0"]
    assert all(is_finished(d, 2, True) for d in dirs) and not is_finished(dirs[0], 3, True)
    _, trained = run_comparison(flags, ["drmas", "grpo"], [0], tmp_path / "cmp", train_fn=fake_train, log=str)
    assert trained == [] and len(calls) == 2
    with pytest.raises(ConfigError, match="sets --seed itself"):
        run_comparison([*flags, "--seed", "1"], ["drmas"], [0], tmp_path / "x", train_fn=fake_train)

    # Regression: a re-run with other settings printed "finished; not re-run" and reported the old runs.
    changed = [*flags, "--num_generations", "4", "--learning_rate", "5e-4"]  # the plain run has 8 and 1e-4
    with pytest.raises(ConfigError) as info:
        run_comparison(changed, ["drmas", "grpo"], [0], tmp_path / "cmp", train_fn=fake_train, log=str)
    assert str(info.value).startswith(
        f"{dirs[0]} was trained with other settings than these flags give (learning_rate: 0.0001 -> 0.0005; "
        "num_generations: 8 -> 4); its results would be reported as this comparison's. Use a new --out"
    )
    assert "or --force to move the old runs aside" in str(info.value) and len(calls) == 2
    # settings that only say where and how a run is logged, or a longer budget, reuse / resume the runs
    _, trained = run_comparison(
        [*flags, "--report_to", "jsonl", "--logging_steps", "2"], ["drmas"], [0], tmp_path / "cmp",
        train_fn=fake_train, log=str,
    )  # fmt: skip
    assert trained == [] and len(calls) == 2
    # --force moves the old runs aside and trains them again
    logs = []
    _, trained = run_comparison(
        changed, ["drmas", "grpo"], [0], tmp_path / "cmp", train_fn=fake_train, log=logs.append, force=True
    )
    assert trained == dirs and len(calls) == 4 and calls[-1] == ("grpo", 0, None)
    assert sorted(p.name.split(".stale-")[0] for p in (tmp_path / "cmp" / "runs").glob("*.stale-*")) == [
        "drmas__seed0",
        "grpo__seed0",
    ]
    assert any("moved to drmas__seed0.stale-" in x and "(--force)" in x for x in logs)


# ~65 s on 2 cores (two tiny trainings): the one end-to-end check that mas-compare cannot rot
def test_tiny_end_to_end_two_modes_then_rerun_trains_nothing(tmp_path, tiny_qwen3_path, monkeypatch, capsys):
    import mas_train.tools.compare as compare

    argv = ["--out", str(tmp_path), "--modes", "drmas,grpo", "--seeds", "0"]
    argv += ["--env", "math-2agent", "--model", "tiny-qwen3", "--max_steps", "1", "--num_generations", "2"]
    argv += ["--tasks_per_step", "1", "--sampling.max_new_tokens", "8", "--eval_sampling.max_new_tokens", "8"]
    argv += ["--eval_num_tasks", "1", "--eval_k", "1", "--eval_steps", "1", "--report_to", "jsonl"]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert sorted(summary["modes"]) == ["drmas", "grpo"]
    assert summary["modes"]["grpo"]["k"] == 1
    assert (tmp_path / "summary.md").is_file() and (tmp_path / "reward.png").stat().st_size > 5000
    assert any(p.name.startswith("grad_norm_") for p in tmp_path.glob("*.png"))
    calls = []
    monkeypatch.setattr(compare, "train_one", lambda cfg: calls.append(cfg) or {})
    assert main(argv) == 0
    assert calls == [] and "finished; not re-run" in capsys.readouterr().out
    # the same comparison with another learning rate is refused with one line, nothing trained or rewritten
    before = (tmp_path / "summary.md").read_text()
    assert main([*argv, "--learning_rate", "5e-4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and err[0].startswith("mas-compare: error: ")
        and "learning_rate: 1e-05 -> 0.0005" in err[0]
    )
    assert calls == [] and (tmp_path / "summary.md").read_text() == before


def test_pool_ray_refusals(tmp_path):
    from mas_train.config import ConfigError

    flags = ["--env", "math-2agent", "--max_steps", "1"]
    with pytest.raises(ValueError, match="unknown pool 'slurm'"):
        run_comparison(flags, ["drmas"], [0], tmp_path, pool="slurm")
    with pytest.raises(ValueError, match="train_fn is for pool='local'"):
        run_comparison(flags, ["drmas"], [0], tmp_path, pool="ray", train_fn=lambda cfg: {})
    with pytest.raises(ConfigError, match="set the runs' own pool to local"):
        run_comparison([*flags, "--pool", "ray"], ["drmas"], [0], tmp_path, pool="ray")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--run_gpus", "1"], "--run_gpus size the Ray task of each training run: add --pool ray"),
        (["--pool", "ray", "--run_cpus", "-1"], "--run_cpus and --run_gpus must be >= 0"),
        (["--runs", "r", "--pool", "ray"], "--pool places training runs: remove it"),
    ],
)
def test_placement_flags_not_honoured_are_refused(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path), *flags])
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_two_modes_as_concurrent_ray_tasks(tmp_path, tiny_qwen3_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    argv = [
        "--out",
        str(tmp_path),
        "--modes",
        "drmas,grpo",
        "--seeds",
        "0",
        "--pool",
        "ray",
        "--run_cpus",
        "1",
    ]
    argv += ["--env", "math-2agent", "--model", "tiny-qwen3", "--max_steps", "1", "--num_generations", "2"]
    argv += ["--tasks_per_step", "1", "--sampling.max_new_tokens", "8", "--eval_steps", "0"]
    argv += ["--report_to", "jsonl"]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert sorted(summary["modes"]) == ["drmas", "grpo"]
    assert all(is_finished(tmp_path / "runs" / f"{m}__seed0", 1, False) for m in ("drmas", "grpo"))


def test_mode_band_keeps_steps_a_seed_did_not_log():
    from pathlib import Path

    from mas_train.tools.compare_plots import _mode_band
    from mas_train.tools.plots import RunMetrics

    a = RunMetrics(Path("a"), "a", {"k": ([1, 2, 3], [1.0, 2.0, 3.0])})
    b = RunMetrics(Path("b"), "b", {"k": ([1, 3], [3.0, 5.0])})  # undefined at step 2 in this seed
    steps, mean, lo, hi = _mode_band([a, b], "k")
    assert steps.tolist() == [1, 2, 3]
    assert (
        mean.tolist() == [2.0, 2.0, 4.0] and lo.tolist() == [1.0, 2.0, 3.0] and hi.tolist() == [3.0, 2.0, 5.0]
    )


def test_report_marks_evaluation_points_but_not_per_step_curves(tmp_path, monkeypatch):
    """Three evaluations joined by lines would read as a measured curve: the eval panel marks its points, the
    12-step training curves stay plain lines."""
    import matplotlib.axes

    drawn = []
    real_plot = matplotlib.axes.Axes.plot

    def recording_plot(ax, *args, **kwargs):
        if "(n=" in str(kwargs.get("label")):  # the per-mode band figures (mas-plot's per-run figures aside)
            drawn.append((kwargs["label"], len(args[0]), kwargs.get("marker")))
        return real_plot(ax, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording_plot)
    evals = ((0, 0.25, 0.5), (6, 0.375, 0.5), (12, 0.5, 0.75))
    dirs = [
        write_fake_run(tmp_path / f"{m}0", mode=m, seed=0, grad_norms={"solver": [1.0] * 12}, evals=evals)
        for m in ("grpo", "drmas")
    ]
    build_report(dirs, tmp_path / "report")
    # one line per mode and panel: the eval panel's lines have the 3 eval steps, the others the 12 training steps
    evals_drawn = [d for d in drawn if d[1] == 3]
    steps_drawn = [d for d in drawn if d[1] == 12]
    assert len(evals_drawn) == 2 and all(marker == "o" for _, _, marker in evals_drawn)
    assert steps_drawn and all(marker is None for _, _, marker in steps_drawn)


def test_a_games_exact_exploitability_is_summarised_first_to_last_and_plotted(tmp_path):
    """Runs that log eval/exploitability (Kuhn poker): summary.json and summary.md give its first, last and change
    per mode (mean over seeds), and the reward figure gets a panel for it; runs without it get no such table."""
    from mas_train.tools.compare_report import build_report

    dirs = []
    for mode, seed, (first, last) in (
        ("drmas", 0, (0.8, 0.5)),
        ("drmas", 1, (0.7, 0.3)),
        ("grpo", 0, (0.8, 0.6)),
    ):
        d = write_fake_run(tmp_path / f"{mode}__seed{seed}", mode=mode, seed=seed)
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        evals = [r for r in rows if "eval/avg@4" in r]
        evals[0]["eval/exploitability"], evals[-1]["eval/exploitability"] = first, last
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        dirs.append(d)
    out = build_report(dirs, tmp_path / "cmp")
    ex = out["modes"]["drmas"]["exploitability"]
    assert ex["first"]["mean"] == pytest.approx(0.75) and ex["last"]["mean"] == pytest.approx(0.4)
    assert ex["change"]["values"] == pytest.approx([-0.3, -0.4])
    md = (tmp_path / "cmp" / "summary.md").read_text()
    # a game's table leads with it (avg@k is 1 for every game) and ranks by it, the worst (highest) first
    assert "| grpo | 0 | 0.800 | 0.600 | -0.200 |" in md and "Exact exploitability" in md
    assert "| drmas | 0,1 | 0.750 ± 0.071 | 0.400 ± 0.141 | -0.350 ± 0.071 |" in md
    assert "final avg@k" not in md and md.count("Exact exploitability") == 1
    assert out["ranking"] == ["grpo", "drmas"]
    assert "Modes by mean final exploitability, highest (worst) first: grpo > drmas." in md
    plain = build_report([write_fake_run(tmp_path / "plain", mode="drmas")], tmp_path / "cmp2")
    assert plain["modes"]["drmas"]["exploitability"] == {}
    assert "Exact exploitability" not in (tmp_path / "cmp2" / "summary.md").read_text()


def test_a_run_another_process_finished_meanwhile_is_not_trained_again(tmp_path):
    """Two mas-compare processes on one folder: the runs are planned at the start, so a run the other process
    finished while this one trained an earlier run must be checked again right before its turn (a search run
    finished by one process was being trained from scratch by the other, about to overwrite its metrics)."""
    calls = []

    def fake_train(cfg):
        calls.append((cfg.advantage_mode, cfg.seed))
        for mode in ("drmas", "grpo"):  # the first call also finishes grpo, as the other process would
            if mode == cfg.advantage_mode or len(calls) == 1:
                run_dir = tmp_path / "cmp" / "runs" / f"{mode}__seed0"
                write_fake_run(run_dir, mode=mode, seed=0, steps=2, evals=((0, 0, 0), (2, 1, 1)))
                if mode == cfg.advantage_mode:
                    cfg.to_yaml(run_dir / "config.yaml")
                (run_dir / "complete.json").write_text('{"step": 2}\n')
        return {"run_dir": str(tmp_path / "cmp" / "runs" / cfg.run_name)}

    logs = []
    flags = ["--env", "math-2agent", "--max_steps", "2", "--eval_steps", "2"]
    _, trained = run_comparison(
        flags, ["drmas", "grpo"], [0], tmp_path / "cmp", train_fn=fake_train, log=logs.append
    )
    assert calls == [("drmas", 0)] and [d.name for d in trained] == ["drmas__seed0"]
    assert any("grpo__seed0 was finished meanwhile" in line for line in logs)
