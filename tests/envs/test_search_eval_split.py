"""The search envs' evaluation split (issue 9, item 13).

Before: the search envs had no `default_eval_tasks`, so `mas-train --env search-3agent` (the README's
command) trained, then ended with `ValueError: no eval tasks`; their default tasks were all 150 bundled
questions, leaving none held out.
"""

from __future__ import annotations

import json

import pytest

from mas_envs.data import load_tasks
from mas_envs.envs.search import KeywordRetriever
from mas_envs.envs.search.data import bundled_hotpotqa, bundled_hotpotqa_path, load_qa
from mas_envs.envs.search.search_1agent import SearchOneAgentEnv
from mas_envs.envs.search.search_3agent import SearchThreeAgentEnv
from retrieval_index.bundled import bundled_corpus_path


def _norm(question: str) -> str:
    return " ".join(question.lower().split())


def test_train_and_dev_share_no_question_and_cover_the_bundle():
    train, dev = bundled_hotpotqa("train"), bundled_hotpotqa("dev")
    assert (len(train), len(dev)) == (100, 50)
    assert not {t["id"] for t in train} & {t["id"] for t in dev}
    assert not {_norm(t["question"]) for t in train} & {_norm(t["question"]) for t in dev}
    assert [t["id"] for t in bundled_hotpotqa("all")] == [t["id"] for t in train + dev]
    assert bundled_hotpotqa() == train  # the default is the training split


def test_the_corpus_holds_the_gold_paragraphs_of_both_splits():
    with open(bundled_corpus_path(), encoding="utf-8") as fh:
        ids = {json.loads(line)["id"] for line in fh}
    for split in ("train", "dev"):
        for t in bundled_hotpotqa(split):
            assert len(t["supporting_ids"]) == 2 and set(t["supporting_ids"]) <= ids, (split, t["id"])


@pytest.mark.parametrize("env_cls", [SearchThreeAgentEnv, SearchOneAgentEnv])
def test_envs_train_on_train_and_evaluate_on_dev(env_cls):
    assert env_cls.default_eval_tasks == "hotpotqa-dev"
    assert [r["id"] for r in load_tasks(bundled_hotpotqa_path("dev"))] == [
        t["id"] for t in bundled_hotpotqa("dev")
    ]
    env = env_cls(retriever=KeywordRetriever([]))
    train_ids = {t["id"] for t in bundled_hotpotqa("train")}
    seen = set()
    for seed in range(30):
        env.reset(seed=seed)
        seen.add(env.task["id"])
    assert seen <= train_ids and len(seen) > 1
    # the trainer and mas-eval load the eval split through the generic loader
    rows = load_tasks(env_cls.default_eval_tasks)
    assert [r["id"] for r in rows] == [t["id"] for t in bundled_hotpotqa("dev")]
    assert all(r["golden_answers"] and r["question"] for r in rows)
    assert not {r["id"] for r in rows} & train_ids


def test_load_qa_bundled_splits():
    assert [t["id"] for t in load_qa("hotpotqa")] == [t["id"] for t in bundled_hotpotqa("dev")]
    assert len(load_qa("hotpotqa", split="train")) == 100 and len(load_qa("hotpotqa", split="all")) == 150
    with pytest.raises(ValueError, match="splits"):
        bundled_hotpotqa("validation")
