"""Episode records (mas_train.episodes) against a scripted env: texts, prompts, scores and advantages exactly."""

from __future__ import annotations

import json
import math

import pytest
from _train_fakes import ScriptEnv, ScriptGenerator, make_script_env

from mas_envs.core import wrap
from mas_envs.envs.search.common import NotesAfterActionMixin
from mas_train.advantages import compute_advantages
from mas_train.backends.base import SamplingParams
from mas_train.episodes import (
    EpisodeLog,
    EvalRecorder,
    episode_records,
    episodes_markdown,
    read_episodes,
    select_train_episodes,
    step_file,
    write_records,
)
from mas_train.eval import evaluate
from mas_train.rollout import RolloutCollector, render_prompt

TASK = {"id": "t0", "question": "What is 6*7?", "answer": "42", "data_source": "toy"}


@pytest.fixture(scope="module")
def tok():
    from mas_train.models import build_qwen_tokenizer

    return build_qwen_tokenizer()


def scripted(replies):
    """A reply function that answers the requests in call order from ``replies``."""
    queue = list(replies)

    def reply(text, sp):
        return queue.pop(0)

    return reply


def collector(tok, reply, factory=make_script_env, **kw):
    return RolloutCollector(
        factory,
        generators={"g": ScriptGenerator(tok, reply)},
        tokenizers={"g": tok},
        agent_groups={"solver": "g", "verifier": "g"},
        sampling={"solver": SamplingParams(max_new_tokens=8), "verifier": SamplingParams(max_new_tokens=8)},
        **kw,
    )


# Episode 0: right answer, approved (R = 1). Episode 1: a malformed answer, rejected, a wrong answer, approved
# (R = 0). Calls: both solvers, both verifiers, episode 1's solver, episode 1's verifier.
REPLIES = [
    "<answer>42</answer>",
    "I think 41",
    "<verify>approve</verify>",
    "<verify>reject</verify>",
    "<answer>41</answer>",
    "<verify>approve</verify>",
]


def _batch_and_advantages(tok):
    batch = collector(tok, scripted(REPLIES)).collect([TASK], 2, step=1, uid_prefix="1/")
    scores = [s.score(0.1) for s in batch.samples]
    adv = compute_advantages(
        scores,
        [s.task_uid for s in batch.samples],
        [s.traj_uid for s in batch.samples],
        [s.agent for s in batch.samples],
    )
    return batch, adv


def test_records_hold_every_turn_of_a_scripted_episode_exactly(tok):
    batch, adv = _batch_and_advantages(tok)
    recs = episode_records(batch, [0, 1], penalty=0.1, kind="train", step=1, advantages=adv)
    r0, r1 = recs
    assert [r["traj_uid"] for r in recs] == ["1/0:t0/0", "1/0:t0/1"] and [r["sample"] for r in recs] == [0, 1]
    for r in recs:
        assert (r["kind"], r["step"], r["task_id"], r["data_source"], r["question"], r["gold"]) == (
            "train",
            1,
            "t0",
            "toy",
            "What is 6*7?",
            "42",
        )
        assert r["task_group"] == {"size": 2, "successes": 1, "mean_reward": 0.5}
    assert (r0["team_reward"], r0["success"], r0["num_turns"]) == (1.0, True, 2)
    assert (r1["team_reward"], r1["success"], r1["num_turns"]) == (0.0, False, 4)
    # a team env's agents share R: no per-seat returns (those are a game's), no league opponents
    assert [(r["returns"], r["opponents"]) for r in recs] == [({}, {}), ({}, {})]
    assert [(t["speaker"], t["turn"], t["text"], t["invalid"]) for t in r1["transcript"]] == [
        ("solver", 0, "I think 41", True),
        ("verifier", 1, "<verify>reject</verify>", False),
        ("solver", 2, "<answer>41</answer>", False),
        ("verifier", 3, "<verify>approve</verify>", False),
    ]
    # scores s = R - 0.1*invalid; Dr. MAS advantages per agent in the task group (population std), by hand:
    # solver scores 1, -0.1, 0: mu 0.3, sigma sqrt(0.74/3); verifier 1, 0, 0: mu 1/3, sigma sqrt(2/9)
    sd_s, sd_v = math.sqrt(0.74 / 3), math.sqrt(2 / 9)
    assert [t["score"] for t in r0["transcript"]] == [1.0, 1.0]
    assert [t["score"] for t in r1["transcript"]] == pytest.approx([-0.1, 0.0, 0.0, 0.0])
    assert [t["advantage"] for t in r0["transcript"]] == pytest.approx([0.7 / sd_s, (2 / 3) / sd_v], rel=1e-5)
    assert [t["advantage"] for t in r1["transcript"]] == pytest.approx(
        [-0.4 / sd_s, (-1 / 3) / sd_v, -0.3 / sd_s, (-1 / 3) / sd_v], rel=1e-5
    )
    # prompts: one table of distinct messages per episode; the solver's second prompt is its first again
    solver_msgs = [{"role": "system", "content": "Solve."}, {"role": "user", "content": "What is 6*7?"}]
    assert r1["messages"] == [
        *solver_msgs,
        {"role": "system", "content": "Verify."},
        {"role": "user", "content": "What is 6*7?\nI think 41"},
        {"role": "user", "content": "What is 6*7?\n<answer>41</answer>"},
    ]
    assert [t["prompt"] for t in r1["transcript"]] == [[0, 1], [2, 3], [0, 1], [2, 4]]
    for t in r1["transcript"]:
        n = len(tok.encode(t["text"], add_special_tokens=False))
        messages = [r1["messages"][i] for i in t["prompt"]]
        assert t["prompt_tokens"] == len(render_prompt(tok, messages))
        assert (t["completion_tokens"], t["logprob_sum"], t["finish_reason"]) == (n, -0.5 * n, "stop")
        assert (t["model_group"], t["weight_version"], t["skipped"]) == ("g", 0, False)
    json.dumps(recs, allow_nan=False)  # plain JSON


class NoteEnv(NotesAfterActionMixin, ScriptEnv):
    """ScriptEnv whose solver turns produce an env message (as the search envs' tool results do)."""

    def apply_action(self, agent, action):
        if agent == "solver":
            self._note_after(f"tool result for {action!r}")
        return super().apply_action(agent, action)


def test_env_messages_sit_after_the_turn_that_caused_them(tok):
    col = collector(tok, scripted(REPLIES), factory=lambda: wrap(NoteEnv()))
    batch = col.collect([TASK], 2)
    rec = episode_records(batch, [1], penalty=0.1, kind="eval", step=0)[0]
    assert [(t["speaker"], t["turn"], t["text"]) for t in rec["transcript"]] == [
        ("solver", 0, "I think 41"),
        ("env", 0, "tool result for 'I think 41'"),
        ("verifier", 1, "<verify>reject</verify>"),
        ("solver", 2, "<answer>41</answer>"),
        ("env", 2, "tool result for '<answer>41</answer>'"),
        ("verifier", 3, "<verify>approve</verify>"),
    ]
    assert rec["transcript"][1] == {"speaker": "env", "turn": 0, "text": "tool result for 'I think 41'"}
    # evaluation records have no advantages
    assert all(t["advantage"] is None for t in rec["transcript"] if t["speaker"] != "env")


def test_a_turn_skipped_for_its_prompt_length_is_recorded_without_a_sample(tok):
    solver_msgs = [{"role": "system", "content": "Solve."}, {"role": "user", "content": TASK["question"]}]
    solver_len = len(render_prompt(tok, solver_msgs))  # the solver's prompt fits, the verifier's does not
    col = collector(tok, scripted(["<answer>42</answer>"]), max_prompt_length=solver_len)
    batch = col.collect([TASK], 1)
    assert [s.agent for s in batch.samples] == ["solver"] and batch.prompt_overflows == {"verifier": 1}
    rec = episode_records(batch, [0], penalty=0.1, kind="train", step=1, advantages=[0.25])[0]
    solver, verifier = rec["transcript"]
    assert (solver["text"], solver["advantage"], solver["score"], solver["skipped"]) == (
        "<answer>42</answer>",
        0.25,
        1.0,
        False,
    )
    assert verifier["skipped"] and verifier["invalid"] and verifier["text"] == ""
    assert verifier["score"] == pytest.approx(0.9) and verifier["advantage"] is None
    assert verifier["completion_tokens"] is None and verifier["model_group"] is None
    assert [rec["messages"][i]["content"] for i in verifier["prompt"]] == [
        "Verify.",
        "What is 6*7?\n<answer>42</answer>",
    ]


def test_train_selection_mixes_successes_and_failures():
    succ = [True, False, False, False, True, False, False, False]
    pick = select_train_episodes(succ, 4, seed=0, step=3)
    assert pick == sorted(pick) and len(set(pick)) == 4
    assert {0, 4} <= set(pick)  # both successes, two of the six failures
    assert pick == select_train_episodes(succ, 4, seed=0, step=3)  # the same on a rerun
    assert sum(succ[i] for i in select_train_episodes(succ, 3, seed=1, step=1)) == 2  # ceil(3/2) successes
    assert select_train_episodes([False] * 3, 2, 0, 1) != []  # one side only: all from it
    assert sum(not s for s in [succ[i] for i in select_train_episodes(succ, 7, 0, 1)]) == 5  # 2 good + 5 bad
    assert select_train_episodes(succ, 20, 0, 1) == list(range(8))
    assert select_train_episodes(succ, 0, 0, 1) == []


def test_eval_recorder_keeps_the_first_episode_of_the_first_tasks_across_batches(tok):
    tasks = [dict(TASK, id=f"t{i}") for i in range(5)]

    def reply(text, sp):
        return "<verify>approve</verify>" if "Verify." in text else "<answer>42</answer>"

    col = collector(tok, reply)
    rec = EvalRecorder(2, 0.1, limit=3, step=7)
    evaluate(col, tasks, k=2, tasks_per_batch=2, on_batch=rec.add)
    assert [(r["task_id"], r["sample"], r["kind"], r["step"]) for r in rec.records] == [
        ("t0", 0, "eval", 7),
        ("t1", 0, "eval", 7),
        ("t2", 0, "eval", 7),
    ]
    every = EvalRecorder(2, 0.1, limit=None)
    evaluate(col, tasks, k=2, tasks_per_batch=2, on_batch=every.add)
    assert [(r["task_id"], r["sample"]) for r in every.records] == [
        (f"t{i}", g) for i in range(5) for g in (0, 1)
    ]


def test_episode_log_files_and_text(tok, tmp_path):
    batch, adv = _batch_and_advantages(tok)
    texts = []
    log = EpisodeLog(
        tmp_path / "rollouts",
        per_step=1,
        per_eval=1,
        penalty=0.1,
        seed=0,
        text_sink=lambda *a: texts.append(a),
    )
    train = log.train(3, batch, adv)
    assert len(train) == 1 and step_file(tmp_path / "rollouts", 3).name == "step-000003.jsonl"
    rec = log.eval_recorder(2, 3)
    rec.add(batch)
    log.write_eval(rec)
    log.write_eval(rec)  # a repeated evaluation of the step replaces its eval records
    on_disk = read_episodes(tmp_path / "rollouts")
    assert [r["kind"] for r in on_disk] == ["train", "eval"] and on_disk[0] == train[0]
    assert on_disk[1]["traj_uid"] == "1/0:t0/0"
    log.train(3, batch, adv)  # a redone step starts its file afresh
    assert [r["kind"] for r in read_episodes(step_file(tmp_path / "rollouts", 3))] == ["train"]
    assert [t[0] for t in texts] == ["episodes/train", "episodes/eval", "episodes/eval", "episodes/train"]
    assert all(t[2] == 3 for t in texts)
    off = EpisodeLog(tmp_path / "off", per_step=0, per_eval=0, penalty=0.1)
    assert off.train(1, batch, adv) == [] and off.eval_recorder(2, 0) is None
    assert not (tmp_path / "off").exists()


def test_markdown_shows_texts_verbatim_and_a_half_written_line_is_skipped(tok, tmp_path):
    batch, adv = _batch_and_advantages(tok)
    recs = episode_records(batch, [1], penalty=0.1, kind="train", step=1, advantages=adv)
    recs[0]["transcript"][0]["text"] = "line one\n```\n<b>two</b>"
    md = episodes_markdown(recs)
    assert "### train step 1: task t0 (toy), failure, R = 0" in md
    assert "    line one\n    ```\n    <b>two</b>" in md  # an indented block: nothing in it is markup
    assert "**solver** (turn 0) **invalid**: score -0.1, advantage -0.805" in md
    path = write_records(tmp_path / "step-000001.jsonl", recs)
    with path.open("a") as fh:
        fh.write('{"kind": "tra')  # a run killed mid-write
    assert read_episodes(path) == json.loads(json.dumps(recs))


def test_log_text_reaches_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mas_train.tracking import RunLogger

    logger = RunLogger(tmp_path, ["tensorboard"])
    logger.log_text("episodes/train", "**solver** said\n\n    42", 5)
    logger.close()
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    events = acc.Tensors("episodes/train/text_summary")
    assert [e.step for e in events] == [5]
    assert events[0].tensor_proto.string_val[0].decode() == "**solver** said\n\n    42"


def test_trainer_writes_each_steps_episodes_with_the_advantages_it_trained_on(tmp_path, tiny_qwen3_path):
    pytest.importorskip("trl")
    from _train_fakes import PARITY_TASKS, make_parity_env

    from mas_train.assemble import assemble_trainer
    from mas_train.config import TrainConfig

    cfg = TrainConfig.from_dict(
        dict(
            env="parity",
            model=tiny_qwen3_path,
            num_generations=2,
            tasks_per_step=2,
            max_steps=1,
            output_dir=str(tmp_path),
            run_name="run",
            sampling={"max_new_tokens": 4},
            eval_k=2,
            log_episodes=4,  # every episode of the step: the whole task groups, so advantages can be recomputed
            log_eval_episodes=2,
        )
    )
    tr = assemble_trainer(
        cfg.resolve(["solver", "verifier"]),
        env_factory=make_parity_env,
        train_tasks=PARITY_TASKS,
        eval_tasks=PARITY_TASKS[:3],
    )
    try:
        tr.train_step()
        tr.evaluate()
    finally:
        tr.close()
    recs = read_episodes(tmp_path / "run" / "rollouts" / "step-000001.jsonl")
    train = [r for r in recs if r["kind"] == "train"]
    assert len(train) == 4 and [r["kind"] for r in recs[4:]] == ["eval", "eval"]
    assert [r["task_id"] for r in recs[4:]] == ["p0", "p1"] and all(r["sample"] == 0 for r in recs[4:])
    turns = [(r, t) for r in train for t in r["transcript"] if not t["skipped"]]
    expected = compute_advantages(
        [t["score"] for _, t in turns],
        [r["task_uid"] for r, _ in turns],
        [r["traj_uid"] for r, _ in turns],
        [t["speaker"] for _, t in turns],
    )
    assert [t["advantage"] for _, t in turns] == pytest.approx(list(expected), abs=1e-9)
    assert any(abs(a) > 0.1 for a in expected)  # the parity env gives every group reward variance
    for r in train:
        assert r["team_reward"] == pytest.approx(
            r["transcript"][0]["score"] + 0.1 * r["transcript"][0]["invalid"]
        )
        assert all(t["completion_tokens"] <= 4 and t["weight_version"] == 0 for _, t in turns)
