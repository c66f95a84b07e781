"""The README's quick start is the product's front door: CI must run exactly its test command."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_readme_quick_start_is_exactly_two_commands():
    cmds = _quick_start_commands()
    assert len(cmds) == 2, cmds
    assert cmds[0].endswith("mas-train --env math-2agent")
    assert cmds[1].endswith("python -m pytest -n 2")


def test_ci_runs_the_readme_test_command_verbatim():
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _quick_start_commands()[1] in ci_lines


def test_ci_lints_with_the_readme_lint_command():
    text = (ROOT / "README.md").read_text()
    lint = next(
        x.split("#")[0].strip() for x in text.splitlines() if "ruff check" in x and "format --check" in x
    )
    assert lint in (ROOT / ".ci" / "run").read_text().splitlines()


def test_ci_type_checks_with_the_readme_mypy_command():
    text = (ROOT / "README.md").read_text()
    check = next(x.split("#")[0].strip() for x in text.splitlines() if x.startswith(".venv/bin/mypy "))
    assert check == ".venv/bin/mypy mas_train mas_envs"
    assert check in (ROOT / ".ci" / "run").read_text().splitlines()
