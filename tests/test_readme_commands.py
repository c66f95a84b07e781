"""Every mas-train / mas-eval / mas-index command the README shows runs to the end.

Each command is parsed exactly as written, then shrunk to a tiny budget (one step, the tiny test model, a few
tokens) so the suite stays fast: what is checked is that the documented flags, configs and env defaults fit
together, from parsing to the final evaluation and checkpoint — the README's own `mas-train --env search-3agent`
once trained its step and then crashed on a missing evaluation set.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("mas-train", "mas-eval", "mas-index", "mas-plot", "mas-compare", "mas-export", "mas-report")
SHRINK = [
    "--num_generations", "2", "--tasks_per_step", "1", "--sampling.max_new_tokens", "4",
    "--eval_num_tasks", "1", "--eval_k", "1", "--eval_steps", "1", "--save_steps", "1", "--report_to", "jsonl",
]  # fmt: skip


def readme_commands() -> list[str]:
    """Command lines of our programs in the README: code-block lines (prompt paths and comments dropped, the
    last command of a `&&` chain) and inline code spans that are whole commands."""
    text = (ROOT / "README.md").read_text()
    found: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            for part in line.split("&&"):
                part = re.sub(r"^\S*/(?=mas-)", "", part.strip())
                if part.startswith(PROGRAMS):
                    found.append(part)
    for span in re.findall(r"`([^`\n]+)`", text):
        if span.startswith(PROGRAMS) and not re.search(r"[|<>]", span) and span.split()[-1] != "N":
            found.append(span)
    return list(dict.fromkeys(found))


def _tiny(cfg):
    """The same run on the tiny test model (every model setting replaced) and at most 1 step (2 to resume)."""
    groups = {k: dataclasses.replace(v, model="tiny-qwen3") for k, v in cfg.model_groups.items()}
    agents = {
        k: dataclasses.replace(v, model="tiny-qwen3" if v.model else None) for k, v in cfg.agents.items()
    }
    return dataclasses.replace(
        cfg, model="tiny-qwen3", model_groups=groups, agents=agents, max_steps=2 if cfg.resume else 1
    )


def test_the_readme_shows_the_commands_this_test_runs():
    cmds = readme_commands()
    assert "mas-train --env math-2agent" in cmds and "mas-eval --help" in cmds
    assert any(c.startswith("mas-train --config examples/") for c in cmds)
    assert any("--resume" in c for c in cmds)


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("readme-runs")


def _order(cmd: str) -> int:
    """Commands that continue or evaluate a run go after the ones that make runs."""
    return 2 if "--checkpoint" in cmd else 1 if "--resume" in cmd else 0


@pytest.mark.parametrize("cmd", sorted(readme_commands(), key=_order))
def test_readme_command_runs(cmd, runs_dir, capsys):
    argv = shlex.split(cmd)
    prog, args = argv[0], argv[1:]
    if prog == "mas-eval" and "--checkpoint" in args:
        from mas_train.checkpoint import find_checkpoint
        from mas_train.cli import eval_main

        run = find_checkpoint("latest", runs_dir).parent.parent
        args = [str(run) if a == "RUN" else a for a in args]
        assert eval_main([*args, "--num_tasks", "1", "--k", "1", "--max_new_tokens", "4"]) == 0
        assert "avg@1" in capsys.readouterr().out
        return
    if "--help" in args or prog != "mas-train":
        main = _main(prog)
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code in (0, None)
        assert capsys.readouterr().out.strip()
        return
    from mas_train.cli import run_training
    from mas_train.config import parse_args

    cfg = _tiny(parse_args([*args, *SHRINK, "--output_dir", str(runs_dir)]))
    summary = run_training(cfg, progress=False)
    assert summary["steps"] == cfg.max_steps and summary["checkpoint"], summary
    assert summary["eval"] or summary["already_complete"], summary
    if not summary["already_complete"]:  # every run draws its pictures: reward and evaluation at least
        names = {Path(p).name for p in summary["plots"]}
        assert {"reward.png", "eval.png"} <= names and all(
            Path(p).stat().st_size > 1000 for p in summary["plots"]
        )


def _main(prog: str):
    if prog == "mas-train":
        from mas_train.cli import train_main as main
    elif prog == "mas-eval":
        from mas_train.cli import eval_main as main
    elif prog == "mas-index":
        from retrieval_index.cli import main
    elif prog == "mas-plot":
        from mas_train.tools.plots import main
    elif prog == "mas-export":
        from mas_train.tools.export import main
    elif prog == "mas-report":
        from mas_train.tools.report import main
    else:
        from mas_train.tools.compare import main

    def run(args):
        code = main(args)
        raise SystemExit(code)

    return run
