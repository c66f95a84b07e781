"""mas-report's page of a real tiny run, opened in a real headless Chromium (the `browser` marker).

Set-up: ``scripts/setup_browser.sh`` (Debian's ``chromium`` and playwright's Python package, which drives it
through ``executable_path``: no browser download). Run: ``pytest -m browser``; ``$MAS_CHROMIUM`` names another
browser binary, ``$MAS_BROWSER_SHOTS`` a folder to keep the screenshots in.

The run is ``mas_train.run.train`` (the body of ``mas-train``) on the tiny Qwen3 model with the parity env of
the trainer tests, whose reward is a checksum of the solver's text: a random-weight model gets successes and
failures, so the outcome filters and the step-0/last comparison have both to show.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
XSS = '</script><script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_qwen3_path):
    pytest.importorskip("trl")
    from _train_fakes import PARITY_TASKS, make_parity_env

    from mas_train.config import TrainConfig
    from mas_train.run import train
    from mas_train.tools.finish import end_of_run

    tmp = tmp_path_factory.mktemp("browser-run")
    held_out = [
        dict(t, id=f"e{i}", question=f"Say something odd #{i}") for i, t in enumerate(PARITY_TASKS[:4])
    ]
    for name, rows in (("train", PARITY_TASKS), ("eval", held_out)):
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = TrainConfig.from_dict(
        dict(
            env="parity",
            model=tiny_qwen3_path,
            train_data=str(tmp / "train.jsonl"),
            eval_data=str(tmp / "eval.jsonl"),
            num_generations=2,
            tasks_per_step=2,
            max_steps=2,
            save_steps=2,
            eval_steps=2,
            eval_num_tasks=4,
            eval_k=2,
            learning_rate=5e-3,  # moves a random model far enough for some eval outcomes to change
            sampling={"max_new_tokens": 6},
            eval_sampling={"max_new_tokens": 6},
            log_episodes=3,
            log_eval_episodes=4,
            output_dir=str(tmp),
            run_name="tiny",
        )
    )
    summary = train(
        cfg, progress=False, out=io.StringIO(), env_factory=make_parity_env, end_of_run=end_of_run()
    )
    assert summary["report"] == str(tmp / "tiny" / "report.html")
    return tmp / "tiny"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: run scripts/setup_browser.sh")
    exe = os.environ.get("MAS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(exe).exists():
        pytest.fail(f"no Chromium at {exe}: run scripts/setup_browser.sh (or set MAS_CHROMIUM)")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=exe,
            headless=True,
            args=FLAGS,
            viewport={"width": 1300, "height": 900},
        )
        yield ctx
        ctx.close()


def _open(browser, path: Path):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    assert errors == [] and page.locator("#js-error").is_hidden()
    return page


def _shot(page, tmp_path: Path, name: str, **kw) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path), **kw)
    keep = os.environ.get("MAS_BROWSER_SHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / name)
    assert path.stat().st_size > 10_000
    return path


def _shown(page) -> int:
    text = page.text_content("#count")
    n = int(page.get_attribute("#count", "data-shown"))
    assert text.startswith(f"{n} of ")
    return n


def test_report_of_a_real_run_filters_and_compares(browser, run_dir, tmp_path):
    from mas_train.episodes import read_episodes

    records = read_episodes(run_dir / "rollouts")
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 6 and len(records) == 6 + 8  # 3 per step, 4 tasks per evaluation at steps 0 and 2
    page = _open(browser, run_dir / "report.html")
    assert page.text_content("#count") == f"{len(records)} of {len(records)} episodes"
    assert page.locator("details.episode").count() == len(records)
    assert page.locator("#curves img").count() >= 3  # reward, eval, invalid rate...
    # the online check: every shown training turn was generated and trained at the same version
    turns = sum(t["speaker"] != "env" and not t["skipped"] for r in train for t in r["transcript"])
    online = " ".join(page.text_content("#online").split())
    assert (
        "refused as stale. 0 is the expected number" in online
        and f"equal in {turns} of the {turns} training turns shown" in online
    )
    _shot(page.locator("#online"), tmp_path, "report-online.png")
    _shot(page, tmp_path, "report-top.png")

    def expect(**filters):
        for sel, value in filters.items():
            page.select_option(f"#f-{sel}", value)
        return _shown(page)

    # step filter: one training step, every card of it
    assert expect(step="train:1") == sum(r["step"] == 1 for r in train) == 3
    cards = page.locator("details.episode")
    assert {
        (cards.nth(i).get_attribute("data-kind"), cards.nth(i).get_attribute("data-step")) for i in range(3)
    } == {("train", "1")}
    assert expect(step="eval") == 8
    assert expect(step="eval:0", outcome="success") == sum(
        r["kind"] == "eval" and r["step"] == 0 and r["success"] for r in records
    )
    assert expect(step="", outcome="failure") == sum(not r["success"] for r in records)
    assert 0 < sum(r["success"] for r in records) < len(records)  # both outcomes to filter
    assert expect(outcome="", agent="verifier") == sum(
        any(t["speaker"] == "verifier" for t in r["transcript"]) for r in records
    )
    assert expect(agent="", source="parity") == len(records)
    word = next(t["text"].strip()[:5] for r in train for t in r["transcript"] if len(t["text"].strip()) >= 5)
    page.fill("#f-text", word)
    assert _shown(page) == sum(
        word.lower() in r["question"].lower()
        or any(word.lower() in t["text"].lower() for t in r["transcript"])
        for r in records
    )
    page.fill("#f-text", "")
    # an episode opened: its turns in order, with their texts, scores and advantages
    page.select_option("#f-step", "train:2")
    first = [r for r in train if r["step"] == 2][0]
    card = page.locator("details.episode").first
    card.locator("summary").click()
    turns = card.locator(".turn")
    turns.first.wait_for()  # the card renders its turns on opening: count them once they are there
    assert turns.count() == len(first["transcript"])
    for i, t in enumerate(first["transcript"]):
        assert turns.nth(i).locator("pre.text").first.text_content() == (t["text"] or "(empty)")
        head = turns.nth(i).locator(".turn-head").text_content()
        assert head.startswith(t["speaker"]) and f"advantage {abs(t['advantage']):.3f}" in head.replace(
            "−", ""
        ).replace("+", "")
        # step 2 sampled with the weights of one update and trained at them: the turn's version badge says so
        assert (t["weight_version"], t["trained_at_version"]) == (1, 1)
        assert turns.nth(i).locator(".badge.ver").text_content() == "v1 → trained at v1"
    page.locator("#episodes").scroll_into_view_if_needed()
    _shot(page, tmp_path, "report-episode.png")

    # step 0 vs the last evaluation, task by task
    ev = {(r["step"], r["task_id"]): r for r in records if r["kind"] == "eval"}
    tasks = [tid for (s, tid) in ev if s == 0]
    rows = page.locator(".cmp-row")
    assert rows.count() == len(tasks) == 4
    for i, tid in enumerate(tasks):
        row = rows.nth(i)
        assert row.get_attribute("data-task") == tid
        cells = row.locator(".cmp-cell")
        assert cells.count() == 2
        assert [cells.nth(j).get_attribute("data-success") for j in (0, 1)] == [
            json.dumps(ev[(0, tid)]["success"]),
            json.dumps(ev[(2, tid)]["success"]),
        ]
        assert cells.nth(0).locator(".cmp-label").text_content() == "step 0 (before training)"
        assert cells.nth(1).locator(".cmp-label").text_content() == "step 2"
        # evaluation turns: the version that generated them (initial weights, then after two syncs), no training
        assert {b.text_content() for b in cells.nth(0).locator(".badge.ver").all()} == {"v0"}
        assert {b.text_content() for b in cells.nth(1).locator(".badge.ver").all()} == {"v2"}
    changed = sum(ev[(0, t)]["success"] != ev[(2, t)]["success"] for t in tasks)
    page.select_option("#cmp-filter", "changed")
    assert page.locator(".cmp-row").count() == changed
    assert page.text_content("#cmp-count") == f"{changed} of 4 tasks"
    page.select_option("#cmp-filter", "")
    _shot(page.locator("#compare"), tmp_path, "report-compare.png")
    page.close()


def test_model_text_with_markup_shows_as_text(browser, run_dir, tmp_path):
    from mas_train.episodes import read_episodes, step_file, write_records
    from mas_train.tools.report import build_run_report

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("checkpoints", "trl", "tb"))
    recs = read_episodes(step_file(copy / "rollouts", 1))
    recs[0]["transcript"][0]["text"] = XSS
    write_records(step_file(copy / "rollouts", 1), recs)
    page = _open(browser, build_run_report(copy))
    assert page.evaluate("window.__pwned") is None
    assert page.locator("img[src='x']").count() == 0
    page.select_option("#f-step", "train:1")
    page.locator("details.episode").first.locator("summary").click()
    assert page.locator("details.episode .turn pre.text").first.text_content() == XSS
    assert page.evaluate("window.__pwned") is None
    page.close()
