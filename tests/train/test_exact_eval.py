"""An env's exact evaluation (``TextAECEnv.exact_evaluation``) through ``mas_train.eval.evaluate``: Kuhn poker's
exploitability read from log-probs, with fake scorers of known log-probs (exact numbers), an env without the
hook (nothing new, nothing scored), a backend that cannot score (skipped with a warning), and one real run on
the tiny Qwen3 whose table is checked against a teacher-forced forward of the model."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from _train_fakes import ScriptGenerator, make_script_env
from transformers import AutoTokenizer

import mas_envs
from mas_envs.games import kuhn
from mas_train.backends.base import SamplingParams
from mas_train.eval import evaluate, write_artifacts
from mas_train.rollout import RolloutCollector

SEATS = ("player_0", "player_1")
DEALS = [{"id": f"kuhn-poker/{a}{b}", "question": "deal", "cards": [a, b], "data_source": "kuhn-poker"}
         for a, b in itertools.permutations("JQK", 2)]  # fmt: skip


@pytest.fixture(scope="module")
def tok(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


class ScoringGenerator(ScriptGenerator):
    """Plays "check"/"fold" always and scores a reply with ``prob(info_set, move)``: the total log-prob is put on
    the completion's first token (the others 0), so it is exact; records each scored info set."""

    def __init__(self, tokenizer, prob):
        super().__init__(
            tokenizer,
            lambda text, sp: "<move>check</move>" if "check" in text[-200:] else "<move>fold</move>",
        )
        self.prob = prob
        self.scored: list[str] = []
        self.can_score = True

    def score(self, prompt_ids, completion_ids):
        out = []
        for p, c in zip(prompt_ids, completion_ids, strict=True):
            key = kuhn.info_set_of(self.tok.decode(p))
            assert c[-1] == self.tok.eos_token_id  # scored as a whole reply, as legal_moves_only plays it
            move = self.tok.decode(c[:-1]).removeprefix("<move>").removesuffix("</move>")
            assert kuhn.action_texts(key)[move] == self.tok.decode(c[:-1])
            self.scored.append(key)
            q = self.prob(key, move)
            out.append([math.log(q) if q > 0 else -math.inf] + [0.0] * (len(c) - 1))
        return out


def _collector(gens, tok, factory=lambda: mas_envs.make("kuhn-poker")):
    return RolloutCollector(
        factory,
        generators=gens,
        tokenizers={g: tok for g in gens},
        agent_groups={a: (a if a in gens else next(iter(gens))) for a in SEATS},
        sampling={a: SamplingParams(max_new_tokens=8) for a in SEATS},
    )


def _table_prob(policy):
    """``prob(info_set, move)`` of a policy table: p(aggressive) for bet/call, 1 - p for check/fold."""

    def prob(key, move):
        aggressive = kuhn.legal_actions(key[1:])[1]
        return policy[key] if move == aggressive else 1.0 - policy[key]

    return prob


def test_uniform_log_probs_give_the_uniform_tables_exploitability_11_24_and_the_table(tok, tmp_path):
    """log 0.5 for both moves everywhere -> the uniform table: exploitability 11/24; a best response gains
    BR0 = 1/2 against player_1 (K bets 1.5, Q bets 0.5, J bets -0.5, per deal third) and BR1 = 5/12 against
    player_0, so exploitability/player_1 = 1/2 + 1/18 = 5/9 and exploitability/player_0 = 5/12 - 1/18 = 13/36;
    the table playing itself gives player_0 1/8. Each seat's information sets go to that seat's model group."""
    gens = {a: ScoringGenerator(tok, lambda key, move: 0.5) for a in SEATS}
    found = []
    out = evaluate(_collector(gens, tok), DEALS, k=1, on_exact=found.append)
    assert out["eval/exploitability"] == pytest.approx(11 / 24, abs=1e-12)
    assert out["eval/exploitability"] == kuhn.exploitability(dict.fromkeys(kuhn.INFO_SETS, 0.5))
    assert out["eval/exploitability/player_1"] == pytest.approx(5 / 9, abs=1e-12)
    assert out["eval/exploitability/player_0"] == pytest.approx(13 / 36, abs=1e-12)
    assert out["eval/game_value"] == pytest.approx(1 / 8, abs=1e-12)
    assert 0.0 <= out["eval/exact_seconds"] <= out["eval/seconds"]
    # 12 information sets x 2 moves, each seat's 6 with its own group
    assert sorted(gens["player_0"].scored) == sorted(2 * ["J", "Q", "K", "Jpb", "Qpb", "Kpb"])
    assert sorted(gens["player_1"].scored) == sorted(2 * ["Jp", "Qp", "Kp", "Jb", "Qb", "Kb"])
    # the policy table: 12 rows in INFO_SETS order, p = 0.5, beside the equilibria's range
    (ev,) = found
    paths = write_artifacts(ev, tmp_path / "evals", suffix="_step3")
    assert (
        list(paths) == ["kuhn_policy"]
        and paths["kuhn_policy"] == tmp_path / "evals" / "kuhn_policy_step3.json"
    )
    table = json.loads(paths["kuhn_policy"].read_text())
    assert [r["info_set"] for r in table["rows"]] == list(kuhn.INFO_SETS)
    assert all(r["p"] == 0.5 for r in table["rows"])
    rows = {r["info_set"]: r for r in table["rows"]}
    assert rows["J"]["equilibrium"] == pytest.approx([0.0, 1 / 3]) and rows["Qpb"][
        "equilibrium"
    ] == pytest.approx([1 / 3, 2 / 3])
    assert rows["Kb"]["equilibrium"] == [1.0, 1.0] and rows["Qp"]["equilibrium"] == [0.0, 0.0]
    assert (rows["Jb"]["seat"], rows["Jb"]["aggressive"], rows["J"]["aggressive"]) == (
        "player_1",
        "call",
        "bet",
    )
    assert rows["Qb"]["logprobs"] == {
        "fold": pytest.approx(math.log(0.5)),
        "call": pytest.approx(math.log(0.5)),
    }
    assert table["exploitability"] == out["eval/exploitability"]
    assert table["br"] == {"player_0": pytest.approx(0.5), "player_1": pytest.approx(5 / 12)}
    assert "Qpb" in ev.table and "0.333-0.667" in ev.table and "exploitability 0.4583" in ev.table


@pytest.mark.parametrize("alpha", [0.0, 1 / 6, 1 / 3])
def test_equilibrium_log_probs_give_exploitability_0_and_value_minus_1_18(tok, alpha):
    """log-probs of an equilibrium (log 0 = -inf for the moves it never plays) -> exploitability 0 for both
    seats, and player_0's value -1/18."""
    prob = _table_prob(kuhn.equilibrium_policy(alpha))
    gens = {a: ScoringGenerator(tok, prob) for a in SEATS}
    out = evaluate(_collector(gens, tok), DEALS[:2], k=1)
    for key in ("eval/exploitability", "eval/exploitability/player_0", "eval/exploitability/player_1"):
        assert out[key] == pytest.approx(0.0, abs=1e-12)
    assert out["eval/game_value"] == pytest.approx(-1 / 18, abs=1e-12)


def test_always_aggressive_from_one_shared_group_gives_one_third(tok):
    """One model group for both seats (model_sharing: shared): it scores all 12 sets; always bet/call -> 1/3."""
    gen = ScoringGenerator(tok, _table_prob(dict.fromkeys(kuhn.INFO_SETS, 1.0)))
    out = evaluate(_collector({"shared": gen}, tok), DEALS[:1], k=1)
    assert out["eval/exploitability"] == pytest.approx(1 / 3, abs=1e-12)
    assert sorted(gen.scored) == sorted(2 * list(kuhn.INFO_SETS))


def test_an_env_without_the_hook_logs_nothing_new_and_scores_nothing(tok):
    """ScriptEnv has no exact evaluation: the same metrics as with exact=False, and the scorer is never called."""

    class NeverScore(ScriptGenerator):
        can_score = True

        def score(self, prompt_ids, completion_ids):
            raise AssertionError("an env without an exact evaluation must not be scored")

    def reply(text, sp):
        return "<answer>42</answer>"

    got = []
    tasks = [{"id": "t", "question": "q", "answer": "42", "data_source": "s"}]
    col = RolloutCollector(
        make_script_env,
        generators={"g": NeverScore(tok, reply)},
        tokenizers={"g": tok},
        agent_groups={"solver": "g", "verifier": "g"},
        sampling={a: SamplingParams(max_new_tokens=8) for a in ("solver", "verifier")},
    )
    with_hook = evaluate(col, tasks, k=1, on_exact=got.append)
    without = evaluate(col, tasks, k=1, exact=False)
    assert set(with_hook) == set(without) and got == []
    assert not any(k.startswith(("eval/exploitability", "eval/exact")) for k in with_hook)


def test_a_group_that_cannot_score_skips_the_exact_evaluation_with_a_warning(tok):
    """A generator without ``score`` (a remote endpoint): kuhn's exact evaluation is skipped, said once."""
    gen = ScriptGenerator(
        tok, lambda text, sp: "<move>check</move>" if "check" in text[-200:] else "<move>fold</move>"
    )
    with pytest.warns(UserWarning, match=r"cannot score.*skipped"):
        out = evaluate(_collector({"g": gen}, tok), DEALS[:1], k=1)
    assert "eval/exploitability" not in out and "eval/avg@1" in out


def test_the_largest_exploitability_of_kuhn_is_17_12():
    """The bound the end-to-end test asserts: exploitability is a max of functions affine in each information
    set's probability, so its largest value lies at a pure table; over all 2^12 of them it is 17/12."""
    worst = max(kuhn.exploitability(dict(zip(kuhn.INFO_SETS, v, strict=True)))
                for v in itertools.product((0.0, 1.0), repeat=12))  # fmt: skip
    assert worst == pytest.approx(17 / 12, abs=1e-12)


def test_tiny_qwen3_run_logs_a_finite_exploitability_and_writes_the_table_each_eval(
    tmp_path, tiny_qwen3_path, tiny_model_and_tokenizer
):
    """A real kuhn-poker trainer on the tiny Qwen3 (shared_lora: one adapter per seat): the step-0 and step-1
    evaluations log eval/exploitability in [0, 17/12] and write evals/kuhn_policy_step-<NNNNNN>.json. At step 0 the
    adapters are the base model (LoRA B = 0), so each row's log-probs equal a teacher-forced forward of the
    base model on the rendered prompt + move text + EOS."""
    pytest.importorskip("trl")
    from mas_train.assemble import assemble_trainer
    from mas_train.backends.testing import teacher_forced_logprobs
    from mas_train.config import TrainConfig
    from mas_train.rollout import render_prompt

    cfg = TrainConfig.from_dict(
        dict(
            env="kuhn-poker",
            model=tiny_qwen3_path,
            num_generations=2,
            tasks_per_step=1,
            max_steps=1,
            output_dir=str(tmp_path),
            run_name="run",
            sampling={"max_new_tokens": 4},
            eval_sampling={"max_new_tokens": 4},
            eval_k=1,
            model_sharing="shared_lora",
            lora={"r": 4, "alpha": 8},
            learning_rate=1e-2,  # a visible change in one step
        )
    )
    tr = assemble_trainer(
        cfg.resolve(list(SEATS)),
        env_factory=lambda: mas_envs.make("kuhn-poker"),
        train_tasks=DEALS,
        eval_tasks=DEALS[:1],
    )
    try:
        assert sorted(tr.groups) == ["player_0", "player_1"]
        first = tr.evaluate()
        tr.train_step()
        last = tr.evaluate()
    finally:
        tr.close()
    for out in (first, last):
        assert 0.0 <= out["eval/exploitability"] <= 17 / 12 and math.isfinite(out["eval/exploitability"])
        assert out["eval/exploitability"] == pytest.approx(
            (out["eval/exploitability/player_0"] + out["eval/exploitability/player_1"]) / 2, abs=1e-12
        )
    step0 = json.loads((tmp_path / "run" / "evals" / "kuhn_policy_step-000000.json").read_text())
    step1 = json.loads((tmp_path / "run" / "evals" / "kuhn_policy_step-000001.json").read_text())
    assert step0["exploitability"] == first["eval/exploitability"]
    assert step1["exploitability"] == last["eval/exploitability"]
    model, mtok = tiny_model_and_tokenizer
    messages = kuhn.info_set_messages()
    for row in step0["rows"]:
        prompt = render_prompt(mtok, messages[row["info_set"]])
        for move, text in kuhn.action_texts(row["info_set"]).items():
            want = sum(
                teacher_forced_logprobs(
                    model, prompt, mtok.encode(text, add_special_tokens=False) + [mtok.eos_token_id], 1.0
                )
            )
            assert row["logprobs"][move] == pytest.approx(want, abs=1e-3)
