"""mas-report's page (mas_train.tools.report) from run folders made of scripted episodes: self-contained, every
record embedded, model text escaped, the comparison page linking each run's page."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from _fake_runs import write_fake_run
from _train_fakes import ScriptGenerator, make_script_env

from mas_train.backends.base import SamplingParams
from mas_train.episodes import EvalRecorder, episode_records, read_episodes, step_file, write_records
from mas_train.rollout import RolloutCollector
from mas_train.tools.report import _spread, build_comparison, build_run_report, main

pytest.importorskip("jinja2")

XSS = '</script><script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
TASKS = [
    {"id": f"t{i}", "question": f"What is {i}+{i}?", "answer": str(2 * i), "data_source": "toy"}
    for i in range(3)
]


@pytest.fixture(scope="module")
def tok():
    from mas_train.models import build_qwen_tokenizer

    return build_qwen_tokenizer()


def make_run(tmp_path, tok, name, *, right_at_end=True):
    """A run folder: config.yaml, metrics.jsonl (eval at 0 and 2, training steps 1-2), rollouts/ of scripted
    episodes whose solver sometimes answers with HTML."""

    def reply_for(step):
        def reply(text, sp):
            if "Verify." in text:
                return "<verify>approve</verify>"
            q = re.search(r"What is (\d+)\+", text)
            right = f"<answer>{2 * int(q.group(1))}</answer>"
            if step == 2 and right_at_end:
                return right
            return right if sp.seed % 2 else XSS

        return reply

    run = tmp_path / name
    run.mkdir()
    cfg = {"env": "script", "model": "tiny-qwen3", "advantage_mode": "drmas", "seed": 0, "eval_k": 2}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    lines = [
        {"step": 0, "time": 100.0, "eval/avg@2": 0.25, "eval/pass@2": 0.5, "eval/reward": 0.25},
        {
            "step": 1,
            "time": 160.0,
            "charts/reward": 0.5,
            "charts/success_rate": 0.5,
            "charts/invalid_rate": 0.25,
            **_versions(0, 8),
        },
        {
            "step": 2,
            "time": 220.0,
            "charts/reward": 0.75,
            "charts/success_rate": 0.75,
            "charts/invalid_rate": 0.0,
            **_versions(1, 6),
        },
        {"step": 2, "time": 280.0, "eval/avg@2": 1.0, "eval/pass@2": 1.0, "eval/reward": 1.0},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for step in (0, 1, 2):
        col = RolloutCollector(
            make_script_env,
            # a training step samples with the weights of the step before (v step-1); an evaluation with v step
            {"g": ScriptGenerator(tok, reply_for(step), weight_version=max(step - 1, 0))},
            {"g": tok},
            {"solver": "g", "verifier": "g"},
            {a: SamplingParams(max_new_tokens=8) for a in ("solver", "verifier")},
        )
        if step:
            batch = col.collect(TASKS[:2], 2, step=step, uid_prefix=f"{step}/")
            adv = [0.5] * len(batch.samples)
            recs = episode_records(
                batch,
                [0, 1, 2],
                penalty=0.1,
                kind="train",
                step=step,
                advantages=adv,
                trained_at={"g": step - 1},
            )
            write_records(step_file(run / "rollouts", step), recs)
        if step in (0, 2):
            col.generators["g"].weight_version = step
            rec = EvalRecorder(2, 0.1, limit=3, step=step)
            rec.add(col.collect(TASKS, 2, step=-1))
            write_records(step_file(run / "rollouts", step), rec.records, replace_kind="eval")
    return run


def _versions(version, checked):
    """The weight-version metrics of model group ``g`` at one step (``ModelGroupWorker.update``'s)."""
    return {
        "weights/trained_at_version/g": float(version),
        "weights/samples_checked/g": float(checked),
        "weights/stale_samples/g": 0.0,
    }


def page_data(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


def test_run_page_is_one_self_contained_file_with_every_episode_escaped(tmp_path, tok):
    run = make_run(tmp_path, tok, "a")
    path = build_run_report(run)
    assert path == run / "report.html"
    html = path.read_text()
    records = read_episodes(run / "rollouts")
    assert len(records) == 12 and sum(XSS in t["text"] for r in records for t in r["transcript"]) > 0
    # model text never appears as markup: the only script elements are the page's own two
    assert XSS not in html and "<script>window" not in html and "<img src=x" not in html
    assert "\\u003c/script\\u003e\\u003cscript\\u003ewindow.__pwned = 1" in html  # carried as escaped JSON
    assert html.count("<script") == 2 and html.count("</script>") == 2
    data = page_data(html)
    assert data["runs"][0]["episodes"] == records  # every record, as written
    assert data["agents"] == ["solver", "verifier"]
    assert data["columns"] == [
        {"run": 0, "step": 0, "label": "step 0 (before training)"},
        {"run": 0, "step": 2, "label": "step 2"},
    ]
    # no network: nothing is loaded from anywhere (figures are data URIs)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html) and "@import" not in html
    assert re.findall(r'<img src="([^"]{0,22})', html) == ["data:image/png;base64,"] * len(
        re.findall(r"<img ", html)
    )
    assert len(re.findall(r"<img ", html)) >= 2  # reward and eval curves, drawn from metrics.jsonl
    # the summary: first vs last evaluation and training step, in numbers
    assert re.search(r"<td>avg@2</td><td>0.25</td><td>1</td><td>\+0.75</td>", html)
    assert re.search(r"<td>reward</td><td>0.5</td><td>0.75</td>", html)
    assert "<th>logged over</th><td>3.0 min</td>" in html  # 280 - 100 s


def test_page_embeds_a_bounded_spread_of_training_steps(tmp_path, tok):
    assert _spread(range(1, 11), 4) == {1, 4, 7, 10}
    assert _spread([3, 1, 2], 5) == {1, 2, 3} and _spread([1, 2, 3], 1) == {3}
    run = make_run(tmp_path, tok, "a")
    data = page_data(build_run_report(run, max_train_steps=1).read_text())
    steps = {(r["kind"], r["step"]) for r in data["runs"][0]["episodes"]}
    assert steps == {("eval", 0), ("train", 2), ("eval", 2)}  # every evaluation, the last training step


def test_comparison_page_links_each_runs_page(tmp_path, tok, capsys):
    a, b = make_run(tmp_path, tok, "a"), make_run(tmp_path, tok, "b", right_at_end=False)
    out = build_comparison([a, b], tmp_path / "cmp" / "index.html")
    html = out.read_text()
    assert '<a href="../a/report.html">a</a>' in html and '<a href="../b/report.html">b</a>' in html
    assert (a / "report.html").is_file() and (b / "report.html").is_file()
    data = page_data(html)
    assert [r["name"] for r in data["runs"]] == ["a", "b"]
    assert data["columns"] == [
        {"run": 0, "step": 2, "label": "a · step 2"},
        {"run": 1, "step": 2, "label": "b · step 2"},
    ]
    assert "avg@2: 0.25 → 1" in html
    # the command line
    assert main([str(a)]) == 0 and capsys.readouterr().out.strip() == str(a / "report.html")
    with pytest.raises(SystemExit):
        main([str(a), str(b)])  # several runs need --out
    assert "give --out" in capsys.readouterr().err
    assert main([str(tmp_path / "nope")]) == 2
    assert "config.yaml not found" in capsys.readouterr().err
    assert main([str(a), str(b), "--out", str(tmp_path / "c.html")]) == 0 and (tmp_path / "c.html").is_file()


def test_a_run_without_episodes_or_metrics_still_gets_a_page(tmp_path):
    run = tmp_path / "bare"
    run.mkdir()
    (run / "config.yaml").write_text("env: math-2agent\nlog_episodes: 0\n")
    html = build_run_report(run).read_text()
    data = page_data(html)
    assert data == {"runs": [{"name": "bare", "episodes": []}], "agents": [], "columns": []}
    assert "No evaluation was logged." in html and "No curves" in html
    assert "No weight-version metrics (<code>weights/…</code>) in metrics.jsonl" in html


def test_run_page_shows_each_turns_weight_versions_and_the_online_check(tmp_path, tok):
    run = make_run(tmp_path, tok, "a")
    html = build_run_report(run).read_text()
    # the online check from metrics.jsonl: 8 + 6 samples checked over the 2 training lines, none stale
    assert '<a href="#online">Online check</a>' in html
    assert '<b id="online-checked">14</b> samples checked in 2 logged steps' in html
    assert '<b id="online-stale" class="ok">0</b> refused as stale' in html
    assert "0 is the expected number, and it is the proof that training was online" in html
    assert "<tr><td>g</td><td>2</td><td>14</td><td>0</td><td>v0 … v1</td></tr>" in html
    # every shown training turn: sampled at v(step-1) and trained at it; evaluation turns: sampled only
    turns = [(r, t) for r in page_data(html)["runs"][0]["episodes"] for t in r["transcript"]]
    train = [t for r, t in turns if r["kind"] == "train"]
    assert {(r["step"], t["weight_version"], t["trained_at_version"]) for r, t in turns} == {
        (0, 0, None),
        (1, 0, 0),
        (2, 1, 1),
        (2, 2, None),
    }
    assert re.search(rf"they are equal in {len(train)} of the\s+{len(train)} training turns shown", html)
    # the badge each turn gets in the browser (report.js; tests/train/test_report_browser.py looks at it)
    assert '"v" + t.weight_version + " → trained at v" + trained' in html


def test_online_check_counts_by_hand():
    from mas_train.tools.online_check import online_check

    lines = [
        {"step": 1, "weights/trained_at_version/a": 0.0, "weights/samples_checked/a": 4.0},
        {"step": 1, "weights/trained_at_version/a": 0.0, "weights/samples_checked/a": 5.0},  # a redone step
        {"step": 2, "weights/trained_at_version/a": 1.0, "weights/samples_checked/a": 3.0},
        {"step": 2, "weights/trained_at_version/b": 0.0, "weights/samples_checked/b": 2.0},
        {"step": 2, "weights/stale_samples/b": 1.0},  # the last line of step 2 counts: a has no metric there
        {"step": 3, "charts/reward": 0.5},  # a line without the metrics (an older run)
    ]
    episodes = [
        {"kind": "train", "transcript": [{"weight_version": 1, "trained_at_version": 1}, {"speaker": "env"}]},
        {"kind": "train", "transcript": [{"weight_version": 0, "trained_at_version": 1}]},
        {"kind": "eval", "transcript": [{"weight_version": 2, "trained_at_version": None}]},
    ]
    assert online_check(lines, episodes) == {
        "rows": [
            {"group": "a", "steps": 1, "checked": 5, "stale": 0, "first": 0, "last": 0},
            {"group": "b", "steps": 0, "checked": 0, "stale": 1, "first": None, "last": None},
        ],
        "checked": 5,
        "stale": 1,
        "steps": 1,
        "turns": 2,
        "turns_equal": 1,
    }


def test_the_page_shows_each_agents_diversity(tmp_path):
    run = write_fake_run(tmp_path / "r", steps=4, diversity=True)
    html = build_run_report(run).read_text(encoding="utf-8")
    table = html[
        html.index('id="diversity-table"') : html.index("</table>", html.index('id="diversity-table"'))
    ]
    rows = re.findall(r"<tr><td>(\w+)</td><td>([^<]+)</td><td>([^<]+)</td><td>([^<]+)</td></tr>", table)
    # fake run, G = 4: the solver's first turns collapse 4 -> 1 and its answers 3 -> 1; the verifier stays at 2
    assert rows == [
        ("solver", "first turns (completions)", "4", "1"),
        ("solver", "final answers (parsed)", "3", "1"),
        ("verifier", "first turns (completions)", "2", "2"),
    ]
    assert "Diversity per agent, step 1 → step 4" in html and "G = 4" in html
    assert 'alt="diversity"' in html  # the figure is on the page too
    plain = build_run_report(write_fake_run(tmp_path / "plain", steps=4)).read_text(encoding="utf-8")
    assert 'id="diversity-table"' not in plain and 'alt="diversity"' not in plain


def test_a_games_summary_leaves_out_team_outcomes_and_leads_with_its_exact_measure(tmp_path):
    # a Kuhn-shaped run: every game "succeeds" (ended by its rules) and the zero-sum team reward is 0, so avg@k,
    # pass@k, reward and success rate say nothing; exploitability and the per-seat results are the measures
    run = tmp_path / "kuhn"
    run.mkdir()
    (run / "config.yaml").write_text("env: kuhn-poker\nlog_episodes: 0\n")
    seats = {
        f"env/player_{i}/{k}": v for i in (0, 1) for k, v in (("win", 0.5), ("loss", 0.5), ("draw", 0.0))
    }
    ev = {"eval/avg@4": 1.0, "eval/pass@4": 1.0, "eval/kuhn-poker/avg@4": 1.0, "eval/reward": 0.0}
    lines = [
        {"step": 0, "time": 1.0, **ev, "eval/exploitability": 0.791, "eval/game_value": 0.011,
         **{"eval/" + k: v for k, v in seats.items()}},
        {"step": 1, "time": 2.0, "charts/reward": 0.0, "charts/success_rate": 1.0, "charts/turns": 2.5, **seats},
        {"step": 2, "time": 3.0, "charts/reward": 0.0, "charts/success_rate": 1.0, "charts/turns": 2.0, **seats},
        {"step": 2, "time": 4.0, **ev, "eval/exploitability": 0.341, "eval/game_value": -0.046,
         **{"eval/" + k: v for k, v in seats.items()}},
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    html = build_run_report(run).read_text(encoding="utf-8")
    table = html[html.index('id="eval-table"') : html.index("</table>", html.index('id="eval-table"'))]
    metrics = re.findall(r"<tr><td>([^<]+)</td>", table)
    assert metrics[:2] == ["exploitability", "game_value"]
    assert not [m for m in metrics if m.startswith(("avg@", "pass@", "reward", "kuhn-poker/"))]
    assert "env/player_0/win" in metrics
    assert re.search(r"<tr><td>exploitability</td><td>0.791</td><td>0.341</td><td>-0.45</td></tr>", table)
    rollouts = html[html.index("Training rollouts") :]
    assert (
        "<td>turns</td>" in rollouts and "<td>reward</td>" not in rollouts and "success_rate" not in rollouts
    )
