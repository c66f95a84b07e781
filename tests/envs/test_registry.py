"""The registry: every registered env passes `check_env` (parametrized by id), and make/spec behave."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from functools import partial

import pettingzoo
import pytest

import mas_envs
from mas_envs.core import TextAECEnv
from mas_envs.testing import check_env

ALL_IDS = list(mas_envs.registry())


@pytest.mark.parametrize("env_id", ALL_IDS, ids=ALL_IDS)
def test_check_env(env_id):
    report = check_env(partial(mas_envs.make, env_id))
    assert report.random_episodes == 1000
    assert report.random_actions >= 1000  # "thousands of random text actions"
    assert 0 < report.invalid_random_actions < report.random_actions  # the fuzz reaches both branches


@pytest.mark.parametrize("env_id", ALL_IDS, ids=ALL_IDS)
def test_pettingzoos_own_api_test_passes_unpatched(env_id):
    # Regression: api_test raised "'str' object has no attribute 'dtype'" on every built-in env (its dtype check
    # of observations); check_env passed only because it patched that check out.
    from pettingzoo.test import api_test

    kwargs = type(mas_envs.make(env_id).unwrapped).conformance_kwargs()
    env = mas_envs.make(env_id, **kwargs)
    api_test(env, num_cycles=50)
    env.reset(seed=0)
    obs = env.observe(env.agent_selection)
    assert isinstance(obs, str) and obs.dtype == env.observation_space(env.agent_selection).dtype
    assert json.loads(json.dumps(obs)) == str(obs) and pickle.loads(pickle.dumps(obs)) == obs


def test_check_env_runs_pettingzoos_api_test_itself():
    import mas_envs.testing as testing

    assert testing.api_test is pettingzoo.test.api_test  # the real one, with nothing patched around it
    assert not hasattr(testing, "_space_compat")


def test_builtin_ids_are_registered_and_versioned():
    assert {"mas/math-2agent-v0", "mas/math-1agent-v0"} <= set(ALL_IDS)
    assert all(pettingzoo.spec("aec", i).version is not None for i in ALL_IDS)


def test_make_resolves_newest_version_and_matches_pettingzoo_make():
    ours = mas_envs.make("math-2agent")
    theirs = pettingzoo.make("aec", "mas/math-2agent")
    assert type(ours.unwrapped) is type(theirs.unwrapped)
    assert isinstance(ours.unwrapped, TextAECEnv)
    assert mas_envs.spec("math-2agent").id == "mas/math-2agent-v0"
    assert mas_envs.spec("mas/math-2agent-v0").id == "mas/math-2agent-v0"


def test_make_passes_kwargs():
    env = mas_envs.make("math-2agent", max_loops=3, invalid_action_penalty=0.5)
    assert env.unwrapped.max_loops == 3 and env.unwrapped.invalid_action_penalty == 0.5


def test_unknown_id_names_close_matches():
    with pytest.raises(mas_envs.UnknownEnvError, match=r"Did you mean 'math-2agent'.*pprint_registry"):
        mas_envs.make("math-2agnet")
    with pytest.raises(mas_envs.UnknownEnvError, match="that version is not registered.*'math-2agent-v0'"):
        mas_envs.make("math-2agent-v7")
    with pytest.raises(mas_envs.UnknownEnvError, match="unknown id"):
        mas_envs.make("no-such-thing")


def test_third_party_register_and_module_prefixed_make(tmp_path, monkeypatch):
    (tmp_path / "third_party_envs.py").write_text(
        textwrap.dedent(
            """
            import mas_envs
            from mas_envs.envs.math.math_1agent import MathOneAgentEnv

            class Shouty(MathOneAgentEnv):
                metadata = {**MathOneAgentEnv.metadata, "name": "shouty-v1"}

            mas_envs.register("tp/shouty-v0", entry_point="third_party_envs:MathOneAgentEnv")
            mas_envs.register("tp/shouty-v1", entry_point=Shouty, kwargs={"invalid_action_penalty": 0.3})
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        env = mas_envs.make("third_party_envs:tp/shouty")  # imports the module, then the newest version
        assert str(env) == "shouty-v1" and env.invalid_action_penalty == 0.3
        assert mas_envs.make("tp/shouty-v0").invalid_action_penalty == 0.1
        assert "tp/shouty-v1" in mas_envs.registry()
    finally:
        for i in ("tp/shouty-v0", "tp/shouty-v1"):
            pettingzoo.aec_registry.pop(i, None)
        sys.modules.pop("third_party_envs", None)


def test_pprint_registry_lists_ids(capsys):
    mas_envs.pprint_registry()
    out = capsys.readouterr().out
    assert "mas/math-2agent-v0" in out and "mas_envs.envs.math.math_2agent:env" in out


def test_import_is_light():
    code = (
        "import sys, mas_envs, mas_envs.testing, mas_envs.rewards, mas_envs.data, mas_envs.procedural; "
        "env = mas_envs.make('math-2agent', prompt_style='fewshot'); env.reset(seed=0); "
        "heavy = [m for m in ('torch', 'transformers', 'faiss', 'datasets', 'trl', 'sympy', 'reasoning_gym', "
        "'matplotlib') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
