"""TrainConfig: resolution of agents to model groups, start-up checks, YAML and CLI views."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from mas_train.backends.base import SamplingParams
from mas_train.config import (
    AgentConfig,
    ConfigError,
    ModelGroupConfig,
    SamplingConfig,
    TrainConfig,
    build_parser,
    config_diff,
    explicit_overrides,
    parse_args,
    parse_eval_args,
)

AGENTS = ["solver", "verifier"]


@pytest.fixture(autouse=True)
def _no_laptop_setting(request, monkeypatch):
    """These tests are about the config's own semantics: parse_args without the default run's laptop layer
    (the test named ..._laptop_setting_... checks that layer)."""
    if "laptop_setting" not in request.node.name and "example_config" not in request.node.name:
        import mas_train.config.train as train_config

        monkeypatch.setattr(train_config, "LAPTOP_DEFAULTS", {})


SEARCH_AGENTS = ["verifier", "search", "answer"]


# ------------------------------------------------------------------------------------------- resolution


def test_default_is_one_shared_group():
    r = TrainConfig().resolve(AGENTS)
    assert list(r.model_groups) == ["shared"]
    g = r.model_groups["shared"]
    assert g.agents == ("solver", "verifier")
    assert g.model == "smollm2-135m-instruct" and g.backend == "hf"
    assert r.agent_to_group == {"solver": "shared", "verifier": "shared"}


def test_per_agent_groups_in_env_order():
    r = TrainConfig(model_sharing="per_agent").resolve(SEARCH_AGENTS)
    assert list(r.model_groups) == SEARCH_AGENTS
    assert all(r.model_groups[a].agents == (a,) for a in SEARCH_AGENTS)


def test_explicit_mapping_and_agent_model_group_override():
    cfg = TrainConfig(
        model_sharing={"verifier": "router", "search": "workers", "answer": "workers"},
        agents={"answer": AgentConfig(model_group="writer")},
    )
    r = cfg.resolve(SEARCH_AGENTS)
    assert r.agent_to_group == {"verifier": "router", "search": "workers", "answer": "writer"}
    assert r.model_groups["workers"].agents == ("search",)


def test_shared_with_different_models_groups_by_model():
    # Dr. MAS sharing: agents with the same model share weights; heterogeneous sizes get their own groups
    cfg = parse_args(
        ["--agent_models", "verifier=Qwen/Qwen2.5-7B,search=meta/Llama-3.2-3B,answer=meta/Llama-3.2-3B"]
    )
    r = cfg.resolve(SEARCH_AGENTS)
    assert r.agent_to_group == {"verifier": "Qwen2.5-7B", "search": "Llama-3.2-3B", "answer": "Llama-3.2-3B"}
    assert r.model_groups["Llama-3.2-3B"].model == "meta/Llama-3.2-3B"
    assert r.model_groups["Llama-3.2-3B"].agents == ("search", "answer")


def test_inheritance_top_level_group_agent():
    cfg = TrainConfig(
        model_sharing="per_agent",
        learning_rate=1e-5,
        grpo={"loss_type": "dr_grpo", "beta": 0.0},
        model_groups={
            "solver": ModelGroupConfig(learning_rate=3e-6, grpo={"beta": 0.04}, backend="sglang_engine")
        },
        agents={"verifier": AgentConfig(weight_decay=0.01)},
    )
    r = cfg.resolve(AGENTS)
    s, v = r.model_groups["solver"], r.model_groups["verifier"]
    assert (s.learning_rate, s.weight_decay, s.backend) == (3e-6, 0.0, "sglang_engine")
    assert (v.learning_rate, v.weight_decay, v.backend) == (1e-5, 0.01, "hf")
    assert s.grpo == {"loss_type": "dr_grpo", "beta": 0.04}
    assert s.grpo_config_kwargs() == {
        "learning_rate": 3e-6,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "warmup_steps": 0.0,
        "lr_scheduler_type": "constant",
        "loss_type": "dr_grpo",
        "beta": 0.04,
    }


def test_grpo_config_kwargs_build_a_trl_grpo_config(tmp_path):
    trl = pytest.importorskip("trl")
    cfg = parse_args(
        ["--grpo.loss_type", "grpo", "--grpo.epsilon_high", "0.28", "--grpo.num_iterations", "2"]
        + ["--model_sharing", "shared", "--learning_rate", "2e-5"]
    )
    kwargs = cfg.resolve(AGENTS).model_groups["shared"].grpo_config_kwargs()
    args = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **kwargs)
    assert (args.loss_type, args.epsilon_high, args.num_iterations, args.learning_rate) == (
        "grpo",
        0.28,
        2,
        2e-5,
    )


def test_grpo_importance_sampling_knobs_pass_but_other_vllm_settings_are_refused():
    cfg = parse_args(["--grpo.vllm_importance_sampling_mode", "token_truncate"])
    kwargs = cfg.resolve(AGENTS).model_groups["shared"].grpo_config_kwargs()
    assert kwargs["vllm_importance_sampling_mode"] == "token_truncate"
    with pytest.raises(ConfigError, match=r"vLLM settings do not apply"):
        parse_args(["--grpo.vllm_gpu_memory_utilization", "0.5"]).resolve(AGENTS)


def test_shared_group_with_different_learning_rates_fails_at_resolve():
    cfg = TrainConfig(
        agents={"solver": AgentConfig(learning_rate=1e-5), "verifier": AgentConfig(learning_rate=2e-6)}
    )
    with pytest.raises(ConfigError) as err:
        cfg.resolve(AGENTS)
    msg = str(err.value)
    for part in (
        "solver",
        "verifier",
        "'shared'",
        "learning_rate",
        "1e-05",
        "2e-06",
        "model_groups.shared.learning_rate",
    ):
        assert part in msg, part


def test_one_agent_override_in_a_shared_group_also_disagrees():
    # the other agent inherits the group value: one optimizer cannot honour both
    cfg = parse_args(["--agents.solver.max_grad_norm", "0.5"])
    with pytest.raises(ConfigError, match=r"disagree on max_grad_norm: solver=0.5, verifier=1.0"):
        cfg.resolve(AGENTS)


def test_agreeing_overrides_are_fine():
    cfg = TrainConfig(agents={a: AgentConfig(learning_rate=4e-6) for a in AGENTS})
    assert cfg.resolve(AGENTS).model_groups["shared"].learning_rate == 4e-6


@pytest.mark.parametrize(
    "cfg",
    [
        TrainConfig(agents={"critic": AgentConfig()}),
        TrainConfig(model_sharing={"solver": "a", "critic": "b"}),
    ],
)
def test_unknown_agent_lists_env_agents(cfg):
    with pytest.raises(ConfigError, match=r"no agent 'critic'; its agents are: solver, verifier"):
        cfg.resolve(AGENTS)


def test_mapping_must_cover_every_agent():
    with pytest.raises(ConfigError, match=r"not 'verifier'"):
        TrainConfig(model_sharing={"solver": "a"}).resolve(AGENTS)


def test_settings_for_a_group_nobody_uses_fail():
    cfg = TrainConfig(model_sharing="per_agent", model_groups={"solvr": ModelGroupConfig(learning_rate=1e-6)})
    with pytest.raises(
        ConfigError, match=r"\['solvr'\] but no agent maps to them; the groups are: solver, verifier"
    ):
        cfg.resolve(AGENTS)


def test_conflicting_models_in_one_group_fail():
    cfg = TrainConfig(
        agents={
            "solver": AgentConfig(model="a", model_group="g"),
            "verifier": AgentConfig(model="b", model_group="g"),
        }
    )
    with pytest.raises(ConfigError, match=r"model group 'g' .* different models"):
        cfg.resolve(AGENTS)


def test_agent_sampling_and_params():
    cfg = TrainConfig(
        agents={"verifier": AgentConfig(sampling=SamplingConfig(temperature=0.5, max_new_tokens=32))}
    )
    r = cfg.resolve(AGENTS)
    assert r.agents["solver"].sampling == cfg.sampling
    p = r.agents["verifier"].sampling_params(["</verify>"])
    assert p == SamplingParams(max_new_tokens=32, temperature=0.5, top_p=1.0, top_k=0, stop=("</verify>",))
    from mas_train.eval import eval_sampling

    # evaluation: the eval temperature/top_p, each agent's own max_new_tokens (issue: per-agent overrides were
    # ignored in training-time evaluation and mas-eval used another rule)
    ev = eval_sampling(r)
    assert ev["verifier"] == SamplingParams(max_new_tokens=32, temperature=0.6, top_p=0.95, top_k=0)
    assert ev["solver"].max_new_tokens == cfg.sampling.max_new_tokens and ev["solver"].temperature == 0.6
    assert eval_sampling(r, temperature=0.0, max_new_tokens=5)["verifier"].max_new_tokens == 5
    assert SamplingConfig(top_k=-1).to_params().top_k == 0


def test_run_name_and_env_kwargs():
    cfg = TrainConfig(seed=3, invalid_action_penalty=0.05, env_kwargs={"max_loops": 3})
    assert re.fullmatch(r"math-2agent__3__\d{8}-\d{6}", cfg.resolve(AGENTS).run_name)
    assert cfg.env_make_kwargs() == {"max_loops": 3, "invalid_action_penalty": 0.05}
    assert TrainConfig(run_name="x", output_dir="o").resolve(AGENTS).run_dir.as_posix() == "o/x"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"advantage_mode": "drmass"}, r"advantage_mode must be one of .* Did you mean 'drmas'"),
        ({"model_sharing": "sharing"}, "model_sharing must be one of"),
        ({"num_generations": 0}, "num_generations must be >= 1"),
        ({"report_to": ["tensorbord"]}, "Did you mean 'tensorboard'"),
        ({"sampling": {"top_p": 0}}, "top_p must be in"),
        (
            {"grpo": {"los_type": "grpo"}},
            "grpo.los_type is not a TRL GRPOConfig setting. Did you mean 'loss_type'",
        ),
        ({"grpo": {"learning_rate": 1.0}}, "set it through the field of the same name"),
        ({"grpo": {"temperature": 1.0}}, r"sampling.temperature"),
        ({"model_groups": {"a": {"backend": "vllm"}}}, "model_groups.a.backend must be one of"),
        ({"model_groups": {"bad name": {}}}, "letters, digits"),
        ({"warmup_steps": 1.5}, "warmup_steps must be an integer"),
        ({"max_steps": "ten"}, "max_steps: cannot read 'ten' as int"),
        ({"modle": "x"}, r"unknown setting 'modle'. Did you mean 'model'"),
        ({"agents": {"solver": {"learning_rat": 1}}}, r"unknown setting 'agents.solver.learning_rat'"),
    ],
)
def test_invalid_settings_raise_clear_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig.from_dict(kwargs)


def test_every_field_has_help_text():
    for cls in (SamplingConfig, ModelGroupConfig, AgentConfig, TrainConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"


# ------------------------------------------------------------------------------------------------ YAML


def test_yaml_round_trip(tmp_path):
    cfg = TrainConfig(
        env="search-3agent",
        env_kwargs={"max_turns": 4},
        model_sharing={"verifier": "v", "search": "sa", "answer": "sa"},
        model_groups={
            "sa": ModelGroupConfig(
                model="tiny-qwen3",
                backend="sglang_engine",
                backend_options={"mem_fraction_static": 0.4},
                grpo={"beta": 0.01},
            )
        },
        agents={"answer": AgentConfig(sampling=SamplingConfig(temperature=0.3), learning_rate=1e-6)},
        report_to=["jsonl"],
        eval_num_tasks=None,
        log_agent_grad_norms=False,
    )
    path = tmp_path / "run.yaml"
    cfg.to_yaml(path)
    back = TrainConfig.from_yaml(path)
    assert back == cfg
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_hand_written_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "env: math-2agent\n"
        "learning_rate: 1e-5\n"  # YAML 1.1 reads this as a string; the config coerces it
        "model_sharing: per_agent\n"
        "sampling: {temperature: 0.9}\n"
        "agents:\n"
        "  verifier:\n"
        "    sampling: {max_new_tokens: 16}\n"
    )
    cfg = TrainConfig.from_yaml(path)
    assert cfg.learning_rate == 1e-5
    # partial per-agent sampling inherits the rest from the top-level sampling
    assert cfg.agents["verifier"].sampling == SamplingConfig(temperature=0.9, max_new_tokens=16)


def test_missing_or_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        TrainConfig.from_yaml(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="YAML mapping"):
        TrainConfig.from_yaml(tmp_path / "list.yaml")


# ------------------------------------------------------------------------------------------------- CLI


def test_cli_flags_override_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "num_generations: 8\nmax_steps: 50\nsampling: {temperature: 0.8}\n"
        "agents: {verifier: {sampling: {temperature: 0.5, top_p: 0.9}}}\ngrpo: {loss_type: bnpo}\n"
    )
    cfg = parse_args(
        [
            "--config",
            str(path),
            "--max_steps",
            "3",
            "--agents.verifier.sampling.temperature",
            "0.7",
            "--grpo.beta=0.04",
        ]
    )
    assert cfg.num_generations == 8  # from YAML
    assert cfg.max_steps == 3  # CLI wins
    assert cfg.sampling.temperature == 0.8
    # keys the agent does not set come from the top-level sampling (here the laptop setting's 32 tokens)
    assert cfg.agents["verifier"].sampling == SamplingConfig(
        temperature=0.7, top_p=0.9, max_new_tokens=cfg.sampling.max_new_tokens
    )
    assert cfg.grpo == {"loss_type": "bnpo", "beta": 0.04}


def test_cli_value_forms():
    cfg = parse_args(
        [
            "--model_sharing", "solver=a,verifier=b",
            "--model", "./ckpt",
            "--learning_rate", "1e-5",
            "--report_to", "tensorboard,jsonl", "wandb",
            "--log_agent_grad_norms", "false",
            "--eval_num_tasks", "none",
            "--invalid_action_penalty", "0.1",
            "--env_kwargs.max_loops", "3",
            "--env_kwargs", "max_turns=4",
            "--sampling.top_k", "20",
            "--model_groups.a.backend", "sglang_engine",
            "--model_groups.a.backend_options.mem_fraction_static", "0.45",
            "--model_groups.a.num_gpus=0.5",
        ]
    )  # fmt: skip
    assert cfg.model_sharing == {"solver": "a", "verifier": "b"}
    assert (cfg.model, cfg.learning_rate, cfg.invalid_action_penalty) == ("./ckpt", 1e-5, 0.1)
    assert cfg.report_to == ["tensorboard", "jsonl", "wandb"]
    assert cfg.log_agent_grad_norms is False and cfg.eval_num_tasks is None
    assert cfg.env_kwargs == {"max_loops": 3, "max_turns": 4}
    assert cfg.sampling.top_k == 20
    g = cfg.resolve(AGENTS).model_groups["a"]
    assert (g.backend_options.mem_fraction_static, g.num_gpus, g.agents) == (0.45, 0.5, ("solver",))
    assert parse_args(["--log_agent_grad_norms"]).log_agent_grad_norms is True


def test_cli_per_agent_models():
    r = parse_args(["--model_sharing", "per_agent", "--agent_models", "solver=path1,verifier=path2"]).resolve(
        AGENTS
    )
    assert (r.model_groups["solver"].model, r.model_groups["verifier"].model) == ("path1", "path2")


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--modle", "x"], r"unknown flag --modle. Did you mean '--model'"),
        (["--agents.solver"], r"expected --agents.<name>.<setting> VALUE"),
        (["--grpo.beta"], r"--grpo.beta needs a value"),
        (["stray"], "unexpected argument 'stray'"),
        (["--agents.solver.temprature", "1"], r"unknown setting 'agents.solver.temprature'"),
    ],
)
def test_cli_errors(argv, match):
    with pytest.raises(ConfigError, match=match):
        parse_args(argv)


def test_help_lists_flags_with_help_text(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for text in (
        "--num_generations",
        "G: trajectories sampled per task",
        "--sampling.temperature",
        "--config YAML",
        "--agent_models",
        "--agents.<agent>.sampling.temperature",
        "--model_groups.<group>.backend_options",
        "(default: drmas)",
    ):
        assert text in out, text
    # every top-level field is reachable as a flag
    flags = {s for a in build_parser()._actions for s in a.option_strings}
    for f in dataclasses.fields(TrainConfig):
        if f.name not in (
            "agents",
            "model_groups",
            "sampling",
            "eval_sampling",
            "task_pool",
            "dynamic_sampling",
            "league",
        ):
            assert f"--{f.name}" in flags, f.name
    # a section is reachable field by field
    assert {
        "--task_pool.enabled",
        "--task_pool.ema",
        "--dynamic_sampling.enabled",
        "--dynamic_sampling.std_tol",
        "--league.enabled",
        "--league.scripted",
    } <= flags


# ------------------------------------------------------------------------------------ new fields and checks


def test_option_lists_are_defined_once():
    from mas_train import advantages, backends
    from mas_train import config as C

    assert C.ADVANTAGE_MODES is advantages.MODES and C.ADVANTAGE_SCOPES is advantages.SCOPES
    assert (
        C.BACKENDS == backends.BACKEND_KINDS == ("hf", "sglang_engine", "sglang_http", "vllm_http", "openai")
    )
    assert "shared_lora" in C.SHARING_MODES


def test_micro_batch_size_top_level_and_per_group():
    r = parse_args(["--model_sharing", "per_agent", "--model_groups.verifier.micro_batch_size", "3"]).resolve(
        AGENTS
    )
    assert (r.model_groups["solver"].micro_batch_size, r.model_groups["verifier"].micro_batch_size) == (2, 3)
    assert (
        parse_args(["--micro_batch_size", "8"]).resolve(AGENTS).model_groups["shared"].micro_batch_size == 8
    )
    with pytest.raises(ConfigError, match="micro_batch_size must be >= 1, got 0"):
        parse_args(["--micro_batch_size", "0"])
    with pytest.raises(ConfigError, match=r"model_groups.a.micro_batch_size must be >= 1 or None, got 0"):
        TrainConfig.from_dict({"model_groups": {"a": {"micro_batch_size": 0}}})


def test_trainable_inherits_and_must_agree_within_a_group():
    r = parse_args(["--model_sharing", "per_agent", "--agents.verifier.trainable", "false"]).resolve(AGENTS)
    assert (r.model_groups["solver"].trainable, r.model_groups["verifier"].trainable) == (True, False)
    assert TrainConfig(trainable=False).resolve(AGENTS).model_groups["shared"].trainable is False
    with pytest.raises(
        ConfigError, match=r"disagree on trainable: solver=True, verifier=False.*trained as a whole"
    ):
        parse_args(["--agents.verifier.trainable", "false"]).resolve(AGENTS)


def test_openai_backend_samples_only():
    from mas_train.backends.options import OpenAIOptions

    base = ["--backend", "openai", "--backend_options", "base_url=http://localhost:8000/v1,model=qwen"]
    with pytest.raises(
        ConfigError, match=r"backend 'openai', which only samples.*model_groups.shared.trainable: false"
    ):
        parse_args(base).resolve(AGENTS)
    g = parse_args([*base, "--trainable", "false"]).resolve(AGENTS).model_groups["shared"]
    assert g.backend_options == OpenAIOptions(base_url="http://localhost:8000/v1", model="qwen")
    assert (g.backend_options.api_key_env, g.backend_options.endpoint, g.backend_options.max_concurrency) == (
        None,  # no key for a server other than api.openai.com (mas_train.backends.endpoint_keys.key_env_for)
        "chat",
        8,
    )
    with pytest.raises(ConfigError, match=r"model_groups.shared.backend_options.base_url is required"):
        parse_args(["--backend", "openai", "--trainable", "false"]).resolve(AGENTS)


def test_backend_options_are_typed_per_kind():
    from mas_train.backends.options import HFOptions, SGLangEngineOptions

    r = parse_args(
        ["--model_sharing", "per_agent", "--model_groups.solver.backend", "sglang_engine"]
        + [
            "--model_groups.solver.backend_options.gpu_ids",
            "[1, 2]",
            "--backend_options.max_batch_size",
            "16",
        ]
    ).resolve(AGENTS)
    s, v = r.model_groups["solver"].backend_options, r.model_groups["verifier"].backend_options
    assert isinstance(s, SGLangEngineOptions) and (s.gpu_ids, s.resolved_tp_size, s.base_gpu_id) == (
        [1, 2],
        2,
        1,
    )
    assert v == HFOptions(
        max_batch_size=16
    )  # top-level backend_options reach the groups of the top-level kind
    with pytest.raises(ConfigError, match=r"unknown setting 'model_groups.a.backend_options.mem_fraction'. Did you "
                       r"mean 'mem_fraction_static'"):  # fmt: skip
        TrainConfig.from_dict(
            {"model_groups": {"a": {"backend": "sglang_http", "backend_options": {"mem_fraction": 1}}}}
        )
    with pytest.raises(
        ConfigError, match=r"model_groups.a.backend_options.tp_size: cannot read 'two' as int"
    ):
        TrainConfig.from_dict(
            {"model_groups": {"a": {"backend": "sglang_http", "backend_options": {"tp_size": "two"}}}}
        )
    with pytest.raises(
        ConfigError, match=r"model_groups.a.backend_options: gpu_ids \[0\] must list tp_size=2"
    ):
        TrainConfig.from_dict(
            {
                "model_groups": {
                    "a": {"backend": "sglang_engine", "backend_options": {"gpu_ids": [0], "tp_size": 2}}
                }
            }
        )


def test_backend_kwargs_is_an_unknown_setting():
    """The never-released spelling is gone: one error naming the right key."""
    with pytest.raises(ConfigError, match="backend_kwargs.*backend_options"):
        TrainConfig.from_dict({"model_groups": {"a": {"backend_kwargs": {"max_batch_size": 3}}}})


def test_lora_and_shared_lora():
    from mas_train.config import LoraConfig

    g = parse_args(["--model_sharing", "per_agent", "--model_groups.solver.lora.r", "8"]).resolve(AGENTS)
    assert g.model_groups["solver"].lora == LoraConfig(r=8, alpha=32, dropout=0.0)
    assert g.model_groups["solver"].lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert g.model_groups["verifier"].lora is None and g.model_groups["verifier"].base_group is None
    r = TrainConfig(model_sharing="shared_lora").resolve(SEARCH_AGENTS)
    assert list(r.model_groups) == SEARCH_AGENTS
    assert [r.model_groups[a].base_group for a in SEARCH_AGENTS] == ["verifier"] * 3
    assert all(r.model_groups[a].lora == LoraConfig() for a in SEARCH_AGENTS)
    with pytest.raises(ConfigError, match=r"shared_lora puts every agent's adapter on one base model"):
        parse_args(["--model_sharing", "shared_lora", "--agent_models", "solver=a,verifier=b"]).resolve(
            AGENTS
        )
    with pytest.raises(ConfigError, match=r"lora.dropout must be in \[0, 1\), got 1.0"):
        TrainConfig.from_dict({"model_groups": {"a": {"lora": {"dropout": 1.0}}}})


def test_top_level_lora_is_every_trainable_groups_default_and_can_be_switched_off():
    from mas_train.config import LoraConfig

    r = parse_args(["--model_sharing", "per_agent", "--lora.r", "4", "--model_groups.verifier.lora.r", "8"])
    groups = r.resolve(AGENTS).model_groups
    assert (groups["solver"].lora, groups["verifier"].lora) == (LoraConfig(r=4), LoraConfig(r=8))
    frozen = parse_args(
        ["--model_sharing", "per_agent", "--lora.r", "4", "--agents.verifier.trainable", "false"]
    )
    assert frozen.resolve(AGENTS).model_groups["verifier"].lora is None  # a frozen group trains no adapter
    assert parse_args(["--lora", "none"]).lora is None
    with pytest.raises(ConfigError, match=r"--lora takes only 'none' \(off\)"):
        parse_args(["--lora", "yes"])
    # a group's unset lora inherits the top-level one: 'none' there would be accepted and not honoured
    with pytest.raises(ConfigError, match=r"--model_groups.solver.lora cannot be switched off on its own"):
        parse_args(["--model_sharing", "per_agent", "--lora.r", "4", "--model_groups.solver.lora", "none"])


def test_checkpoint_and_eval_cadence_fields():
    cfg = TrainConfig()
    assert (cfg.save_total_limit, cfg.eval_before_training) == (2, True)
    cfg = parse_args(["--save_total_limit", "none", "--eval_before_training=false"])
    assert (cfg.save_total_limit, cfg.eval_before_training) == (None, False)
    with pytest.raises(ConfigError, match="save_total_limit must be >= 1 or None, got 0"):
        parse_args(["--save_total_limit", "0"])


@pytest.mark.parametrize(
    ("key", "match"),
    [
        (
            "repetition_penalty",
            r"does not honour: sampling is done by our backends; use sampling.\* settings",
        ),
        ("scale_rewards", "advantages come from advantage_mode"),
        ("sync_ref_model", "does not honour: our update calls TRL's compute_loss"),
        ("use_vllm", "model_groups.<g>.backend"),
    ],
)
def test_grpo_settings_our_update_does_not_honour_are_refused(key, match):
    with pytest.raises(ConfigError, match=rf"grpo.{key}.*{match}"):
        parse_args([f"--grpo.{key}", "1"])


def test_grpo_honoured_settings_are_grpo_config_fields():
    trl = pytest.importorskip("trl")
    from mas_train.config import GRPO_HONOURED

    assert GRPO_HONOURED <= {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert parse_args(["--grpo.mask_truncated_completions", "true"]).grpo == {
        "mask_truncated_completions": True
    }


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (
            ["--grpo.loss_type", "foo"],
            r"grpo.loss_type must be one of \['grpo', 'dr_grpo', 'dapo'.*got 'foo'",
        ),
        (["--grpo.loss_type", "drgrpo"], r"got 'drgrpo'. Did you mean 'dr_grpo'"),
        (["--grpo.importance_sampling_level", "seq"], r"importance_sampling_level must be one of \['token'"),
        (["--grpo.vllm_importance_sampling_mode", "mask"], r"vllm_importance_sampling_mode must be one of"),
        (
            ["--model_sharing", "per_agent", "--model_groups.solver.grpo.loss_type", "x"],
            r"model_groups.solver",
        ),
        (["--grpo.optim", "adam"], r"grpo.optim must be one of \['adamw_torch'"),
        (["--lr_scheduler_type", "cosin"], r"lr_scheduler_type must be one of .*Did you mean 'cosine'"),
        (["--agents.solver.lr_scheduler_type", "nope"], r"agents.solver: lr_scheduler_type must be one of"),
    ],
)
def test_enumerated_settings_are_checked_at_start_up(argv, match):
    # Regression: `--grpo.loss_type foo` loaded the model and ran a rollout before TRL raised (18 s, a run folder).
    with pytest.raises(ConfigError, match=match):
        parse_args(argv)
    ok = parse_args(["--grpo.loss_type", "dr_grpo", "--grpo.optim", "adamw_torch"])
    assert ok.grpo == {"loss_type": "dr_grpo", "optim": "adamw_torch"}


def test_enumerated_values_are_the_ones_trl_and_transformers_accept():
    trl = pytest.importorskip("trl")
    from transformers.trainer_utils import SchedulerType

    from mas_train.config import GRPO_CHOICES
    from mas_train.config.common import LR_SCHEDULER_TYPES

    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(trl.GRPOConfig)}
    for key, values in GRPO_CHOICES.items():
        listed = re.search(r"Supported (?:values|options) are:? (.*?)\.", helps[key])
        quoted = re.findall(r"'(\w+)'", listed.group(1) if listed else helps[key])
        assert set(quoted) == set(values), key
    assert set(LR_SCHEDULER_TYPES) == {s.value for s in SchedulerType}


def test_settings_a_run_cannot_honour_are_refused():
    # Regression: LoRA settings on a frozen group were dropped silently, and G = 1 trained on all-zero advantages.
    with pytest.raises(ConfigError, match=r"model_groups.verifier.lora is set but the group is frozen"):
        parse_args(
            ["--model_sharing", "per_agent", "--model_groups.verifier.trainable", "false"]
            + ["--model_groups.verifier.lora.r", "8"]
        ).resolve(AGENTS)
    with pytest.raises(ConfigError, match=r"lora is set but every model group is frozen"):
        parse_args(["--trainable", "false", "--lora.r", "8"]).resolve(AGENTS)
    with pytest.raises(ConfigError, match=r"lora is set but every model group is frozen"):
        TrainConfig.from_dict({"trainable": False, "lora": {"r": 8}}).resolve(AGENTS)
    with pytest.raises(
        ConfigError, match=r"num_generations must be >= 2: .* every trajectory's advantage is 0"
    ):
        parse_args(["--num_generations", "1"])
    with pytest.raises(ConfigError, match=r"num_generations must be >= 2"):
        parse_args(["--num_generations", "1", "--advantage_scope", "batch"])  # one task per step: still 0
    ok = parse_args(["--num_generations", "1", "--advantage_scope", "batch", "--tasks_per_step", "4"])
    assert ok.num_generations == 1  # the batch baseline compares the step's 4 tasks


def test_a_frozen_plain_run_keeps_the_laptop_setting_without_its_adapter():
    # the laptop preset's lora is not the user's setting: a frozen plain run leaves it out instead of refusing
    from mas_train.config.train import laptop_layer

    assert "lora" in laptop_layer([{}])[0] and "lora" not in laptop_layer([{"trainable": False}])[0]
    assert parse_args(["--trainable", "false"]).lora is None


def test_negative_numbers_in_any_notation_are_flag_values():
    # Regression: `--learning_rate -1e-4` got argparse's "expected one argument" instead of our range check.
    with pytest.raises(ConfigError, match=r"learning_rate must be >= 0, got -0.0001"):
        parse_args(["--learning_rate", "-1e-4"])
    cfg = parse_args(["--grpo.beta", "-1e-3", "--env_kwargs.offset", "-2.5E+1", "--seed", "-3"])
    assert (cfg.grpo, cfg.env_kwargs, cfg.seed) == ({"beta": -0.001}, {"offset": -25.0}, -3)
    with pytest.raises(ConfigError, match=r"temperature must be >= 0, got -0.01"):
        parse_eval_args(["--model", "tiny-qwen3", "--temperature", "-1e-2"])


def test_every_example_config_parses():
    import warnings
    from pathlib import Path

    paths = sorted(Path(__file__).resolve().parents[2].glob("examples/**/*.yaml"))
    assert len(paths) >= 6
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the examples use the current spellings
        configs = {p.name: TrainConfig.from_yaml(p) for p in paths}
    assert configs["gpu_single.yaml"].model_groups["shared"].backend_options["gpu_ids"] == [0]
    vllm = configs["vllm_cpu.yaml"]
    assert (vllm.backend, vllm.backend_options["kv_cache_gib"]) == ("vllm_http", 1)
    vllm_group = vllm.resolve(AGENTS).model_groups["shared"]
    assert vllm_group.backend_options.python == ".venv-vllm/bin/python" and vllm_group.lora is None
    assert configs["math_2agent_cpu.yaml"].grpo == {"loss_type": "dapo", "epsilon": 0.2, "beta": 0.0}
    # the default run written out is the default run (its grpo section only restates TRL's defaults)
    diff = config_diff(parse_args([]), configs["math_2agent_cpu.yaml"])
    assert diff == {"grpo.loss_type": (None, "dapo"), "grpo.epsilon": (None, 0.2), "grpo.beta": (None, 0.0)}
    groups = configs["math_2agent_non_shared.yaml"].resolve(AGENTS).model_groups
    assert (groups["solver"].lora.r, groups["verifier"].lora.r) == (16, 8)  # the laptop lora, and its own


def test_cli_strings_stay_strings_and_errors_are_one_config_error():
    assert parse_args(["--run_name", "no", "--model=./ckpt"]).run_name == "no"
    assert parse_args(["--report_to", "jsonl"]).report_to == ["jsonl"]
    with pytest.raises(ConfigError, match=r"^max_steps: cannot read 'ten' as int$"):
        parse_args(["--max_steps", "ten"])
    with pytest.raises(ConfigError, match=r"unknown setting 'model_groups.g.learning_rat'. Did you mean"):
        parse_args(["--model_groups.g.learning_rat", "1"])


# ------------------------------------------------------------------------------------------ resume, diffs


def _fake_checkpoint(run_dir, cfg, step=2):
    ckpt = run_dir / "checkpoints" / f"step-{step:06d}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.pt").write_bytes(b"")
    cfg.to_yaml(ckpt / "config.yaml")
    return ckpt


def test_plain_run_of_math_2agent_gets_the_laptop_setting_and_any_task_or_model_choice_leaves_it():
    from mas_train.config import LAPTOP_DEFAULTS

    lap = LAPTOP_DEFAULTS["math-2agent"]
    plain = parse_args([])
    assert (
        plain.env == "math-2agent"
        and plain.train_data == lap["train_data"] == parse_args(["--env", "math-2agent"]).train_data
    )
    assert (plain.eval_data, plain.env_kwargs) == (lap["eval_data"], {"prompt_style": "fewshot"})
    assert plain.num_generations == lap["num_generations"] and plain.sampling.max_new_tokens == 32
    assert (
        plain.sampling.temperature == TrainConfig().sampling.temperature
    )  # the preset's sampling is partial
    # a field the user sets wins; env_kwargs merge key by key
    mine = parse_args(["--max_steps", "3", "--env_kwargs", "max_loops=3"])
    assert mine.max_steps == 3 and mine.env_kwargs == {"prompt_style": "fewshot", "max_loops": 3}
    assert mine.train_data == lap["train_data"]
    assert parse_args(["--env_kwargs", "prompt_style=paper"]).env_kwargs == {"prompt_style": "paper"}
    # the learning rate is a LoRA one, so every sharing mode keeps adapters; --lora none is full fine-tuning
    for sharing in ("per_agent", "shared"):
        groups = parse_args(["--model_sharing", sharing]).resolve(AGENTS).model_groups
        assert all(g.lora is not None and g.learning_rate == lap["learning_rate"] for g in groups.values())
    assert (
        parse_args(["--model_sharing", "shared", "--lora", "none"])
        .resolve(AGENTS)
        .model_groups["shared"]
        .lora
        is None
    )
    # naming tasks or another model: the paper setting (env's own data and prompts) and the plain defaults
    for argv in (
        ["--train_data", "gsm8k-train"],
        ["--eval_data", "gsm8k-test"],
        ["--model", "tiny-qwen3"],
        ["--agents.verifier.model", "tiny-qwen3"],
        ["--env", "search-3agent", "--train_data", "hotpotqa"],
    ):
        c = parse_args(argv)
        assert c.env_kwargs == {} and c.num_generations == TrainConfig().num_generations, argv
        assert c.sampling.max_new_tokens == TrainConfig().sampling.max_new_tokens, argv
    assert parse_args(["--train_data", "gsm8k-train"]).eval_data is None
    assert (
        parse_args(["--model", "smollm2-135m-instruct"]).train_data == lap["train_data"]
    )  # the default model


def test_plain_search_run_is_its_written_out_example_config_and_the_paper_setting_is_one_flag_away():
    from pathlib import Path

    from mas_train.config import LAPTOP_DEFAULTS

    example = TrainConfig.from_yaml(
        Path(__file__).resolve().parents[2] / "examples" / "search_3agent_cpu.yaml"
    )
    plain = parse_args(["--env", "search-3agent"])
    # the example restates TRL's grpo defaults, as math_2agent_cpu.yaml does; everything else is equal
    assert config_diff(plain, example) == {
        "grpo.loss_type": (None, "dapo"),
        "grpo.epsilon": (None, 0.2),
        "grpo.beta": (None, 0.0),
    }
    assert plain.env_kwargs == {
        "prompt_style": "fewshot",
        "retriever": "multihop?seed=0",
        "topk": 1,
        "max_turns": 3,
        "first_turn": "search",
    }
    assert (plain.train_data, plain.eval_data) == ("multihop?seed=0&split=train", "multihop?seed=0&split=dev")
    assert (plain.eval_num_tasks, plain.eval_k) == (50, 4)  # the issue: >= 50 held-out questions x k >= 4
    one = parse_args(["--env", "search-1agent"])
    assert (
        one.train_data == plain.train_data
        and one.env_kwargs == LAPTOP_DEFAULTS["search-1agent"]["env_kwargs"]
    )
    assert (one.max_steps, one.num_generations, one.eval_num_tasks) == (16, 8, 50)  # the 3-agent budget
    # the paper setting: name its tasks (or another model) and the env's own prompts, data and retriever apply
    for argv in (["--train_data", "hotpotqa"], ["--model", "tiny-qwen3"]):
        paper = parse_args(["--env", "search-3agent", *argv])
        assert paper.env_kwargs == {} and paper.eval_data is None, argv
        assert paper.eval_num_tasks == TrainConfig().eval_num_tasks, argv


def test_reference_search_example_config_is_the_plain_search_run_with_the_reference_turn_order():
    from pathlib import Path

    import mas_envs

    path = Path(__file__).resolve().parents[2] / "examples" / "search_3agent_reference.yaml"
    reference = TrainConfig.from_yaml(path)
    plain = parse_args(["--env", "search-3agent"])
    # the grpo defaults restated (as in search_3agent_cpu.yaml) and the turn order: nothing else differs
    assert config_diff(plain, reference) == {
        "grpo.loss_type": (None, "dapo"),
        "grpo.epsilon": (None, 0.2),
        "grpo.beta": (None, 0.0),
        "env_kwargs.max_turns": (3, 4),
        "env_kwargs.first_turn": ("search", "verify"),
        "env_kwargs.last_turn": (None, "verify"),
        "env_kwargs.malformed_answer": (None, "continue"),
    }
    assert reference.env_kwargs == {
        "prompt_style": "fewshot",
        "retriever": "multihop?seed=0",
        "topk": 1,
        "max_turns": 4,
        "first_turn": "verify",
        "last_turn": "verify",
        "malformed_answer": "continue",
    }
    # the same run from the command line, and the env accepts the kwargs (the retriever resolves lazily)
    assert parse_args(["--config", str(path)]) == reference
    env = mas_envs.make("search-3agent", **reference.env_kwargs).unwrapped
    assert (env.turn_limit, env.first_turn, env.last_turn, env.malformed_answer) == (
        4,
        "verify",
        "verify",
        "continue",
    )


def test_resume_takes_the_runs_saved_config_as_base(tmp_path):
    saved = TrainConfig(
        env="math-1agent", max_steps=4, learning_rate=3e-6, output_dir=str(tmp_path), run_name="r1"
    )
    _fake_checkpoint(tmp_path / "r1", saved)
    cfg = parse_args(["--resume", str(tmp_path / "r1"), "--max_steps", "8"])
    assert (cfg.env, cfg.max_steps, cfg.learning_rate, cfg.run_name) == ("math-1agent", 8, 3e-6, "r1")
    assert cfg.resume == str(tmp_path / "r1")
    latest = parse_args(["--resume", "latest", "--output_dir", str(tmp_path)])
    assert (latest.env, latest.max_steps) == ("math-1agent", 4)
    with pytest.raises(ConfigError, match="not a checkpoint folder"):
        parse_args(["--resume", str(tmp_path / "nope")])


def test_explicit_overrides_and_config_diff():
    argv = [
        "--max_steps",
        "3",
        "--agents.verifier.sampling.temperature",
        "0.6",
        "--env_kwargs",
        "max_loops=3",
    ]
    assert explicit_overrides(argv) == {
        "max_steps",
        "agents.verifier.sampling.temperature",
        "env_kwargs.max_loops",
    }
    a, b = parse_args([]), parse_args([*argv, "--learning_rate", "3e-6"])
    diff = config_diff(a, b)
    assert diff["max_steps"] == (a.max_steps, 3) and diff["learning_rate"] == (a.learning_rate, 3e-6)
    assert diff["env_kwargs.max_loops"] == (None, 3)
    assert diff["agents.verifier.sampling.temperature"] == (None, 0.6)
    # the new agent section brings its other (default) values along; nothing else differs
    assert diff["agents.verifier.name"] == (None, "verifier")
    assert set(diff) - {k for k in diff if k.startswith("agents.verifier.")} == {
        "max_steps",
        "learning_rate",
        "env_kwargs.max_loops",
    }
    assert config_diff(a, parse_args([])) == {}


# ---------------------------------------------------------------------------------------------- mas-eval


def test_eval_config_parses_the_mas_eval_flags():
    e = parse_eval_args(
        ["--checkpoint", "runs/x", "--k", "2", "--num_tasks", "5", "--env_kwargs.max_loops", "3"]
    )
    assert (e.checkpoint, e.k, e.num_tasks, e.env_kwargs, e.tasks_per_batch) == (
        "runs/x",
        2,
        5,
        {"max_loops": 3},
        None,  # the checkpoint's eval_tasks_per_batch (the same batches as the run's evaluations), else 8
    )
    assert (e.temperature, e.top_p, e.max_new_tokens, e.initial) == (None, None, None, False)
    assert parse_eval_args(["--checkpoint", "runs/x", "--initial"]).initial is True


def test_mas_eval_of_a_checkpoint_defaults_to_the_runs_evaluation_size():
    # Regression: on a run that evaluated 2 tasks x k=2, `mas-eval --checkpoint RUN` ran all 1319 tasks x k=4.
    run = TrainConfig(eval_k=2, eval_num_tasks=3)
    assert parse_eval_args(["--checkpoint", "r"]).evaluation_size(run) == (2, 3)
    assert parse_eval_args(["--checkpoint", "r", "--k", "5", "--num_tasks", "0"]).evaluation_size(run) == (
        5,
        None,
    )
    assert parse_eval_args(["--checkpoint", "r", "--data", "math500"]).evaluation_size(run) == (2, None)
    assert parse_eval_args(["--model", "m"]).evaluation_size(run) == (
        4,
        None,
    )  # no run: the defaults, all tasks


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--num_tasks", "-1"], r"^num_tasks must be >= 0 or None, got -1$"),
        (["--tasks_per_batch", "0"], r"^tasks_per_batch must be >= 1 or None, got 0$"),
        (["--checkpoint", "a", "--model", "b"], "not both"),
        (["--initial"], "give --checkpoint"),
        (["--k", "x"], r"k: cannot read 'x' as int"),
        (["--tempreature", "1"], r"unknown flag --tempreature. Did you mean '--temperature'"),
    ],
)
def test_eval_config_errors(argv, match):
    with pytest.raises(ConfigError, match=match):
        parse_eval_args(argv)


def test_eval_help_lists_every_field(capsys):
    from mas_train.config import EvalConfig

    with pytest.raises(SystemExit):
        parse_eval_args(["--help"])
    out = capsys.readouterr().out
    for f in dataclasses.fields(EvalConfig):
        assert f"--{f.name}" in out and f.metadata["help"], f.name


# ------------------------------------------------------------------------------------------ one tier of defaults

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: ``parse_args(["--env", "math-2agent"]).to_dict()`` at ddc0558, before the defaults were moved onto the fields
PLAIN_RUN_AT_DDC0558 = {
    "advantage_eps": 1e-06,
    "advantage_mode": "drmas",
    "advantage_scope": "group",
    "agents": {},
    "backend": "hf",
    "backend_options": {},
    "data_fields": {},
    "device": "auto",
    "dtype": "auto",
    "env": "math-2agent",
    "env_kwargs": {"prompt_style": "fewshot"},
    "eval_before_training": True,
    "eval_data": "rg:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=1&operators=+,-&allow_negation=false&allow_parentheses=false&size=50&seed=1001",
    "eval_k": 4,
    "eval_num_tasks": 50,
    "eval_sampling": {"max_new_tokens": None, "temperature": 0.6, "top_k": 0, "top_p": 0.95},
    "eval_steps": 14,
    "grpo": {},
    "invalid_action_penalty": None,
    "learning_rate": 0.0001,
    "log_agent_grad_norms": None,
    "logging_steps": 1,
    "lora": {
        "alpha": 32,
        "dropout": 0.0,
        "r": 16,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    },
    "lr_scheduler_type": "constant",
    "max_grad_norm": 1.0,
    "max_prompt_length": 1024,
    "max_steps": 14,
    "micro_batch_size": 2,
    "model": "smollm2-135m-instruct",
    "model_groups": {},
    "model_sharing": "shared_lora",
    "num_generations": 8,
    "num_ranks": 1,
    "output_dir": "runs",
    "pool": "local",
    "report_to": ["tensorboard", "jsonl"],
    "resume": None,
    "run_name": None,
    "sampling": {"max_new_tokens": 32, "temperature": 0.7, "top_k": 0, "top_p": 1.0},
    "save_steps": 7,
    "save_total_limit": 2,
    "seed": 0,
    "sharding": "fsdp2",
    "tasks_per_step": 2,
    "train_data": "rg:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=1&operators=+,-&allow_negation=false&allow_parentheses=false&size=1000&seed=1",
    "trainable": True,
    "warmup_steps": 0.0,
    "weight_decay": 0.0,
}
#: ``parse_args(["--train_data", "gsm8k-train"]).to_dict()`` at ddc0558: the paper setting, one flag away
PAPER_RUN_AT_DDC0558 = {
    "advantage_eps": 1e-06,
    "advantage_mode": "drmas",
    "advantage_scope": "group",
    "agents": {},
    "backend": "hf",
    "backend_options": {},
    "data_fields": {},
    "device": "auto",
    "dtype": "auto",
    "env": "math-2agent",
    "env_kwargs": {},
    "eval_before_training": True,
    "eval_data": None,
    "eval_k": 4,
    "eval_num_tasks": 2,
    "eval_sampling": {"max_new_tokens": None, "temperature": 0.6, "top_k": 0, "top_p": 0.95},
    "eval_steps": 6,
    "grpo": {},
    "invalid_action_penalty": None,
    "learning_rate": 1e-05,
    "log_agent_grad_norms": None,
    "logging_steps": 1,
    "lora": None,
    "lr_scheduler_type": "constant",
    "max_grad_norm": 1.0,
    "max_prompt_length": 1024,
    "max_steps": 6,
    "micro_batch_size": 2,
    "model": "smollm2-135m-instruct",
    "model_groups": {},
    "model_sharing": "shared",
    "num_generations": 4,
    "num_ranks": 1,
    "output_dir": "runs",
    "pool": "local",
    "report_to": ["tensorboard", "jsonl"],
    "resume": None,
    "run_name": None,
    "sampling": {"max_new_tokens": 128, "temperature": 0.7, "top_k": 0, "top_p": 1.0},
    "save_steps": 3,
    "save_total_limit": 2,
    "seed": 0,
    "sharding": "fsdp2",
    "tasks_per_step": 1,
    "train_data": "gsm8k-train",
    "trainable": True,
    "warmup_steps": 0.0,
    "weight_decay": 0.0,
}


# Settings added since ddc0558 (role/turn credit, episode records), at defaults that change nothing of a run
ADDED_SINCE_DDC0558 = {
    "advantage_turn_min_samples": 2,
    "advantage_stats": "paper",
    "advantage_rae_decay": 0.95,  # issue 40: only read under advantage_mode rae
    "log_episodes": 4,
    "log_eval_episodes": 16,
    # issue 41: evaluation batching now a setting (8 tasks at a time, as before); task pool and dynamic sampling off
    "eval_tasks_per_batch": 8,
    "task_pool": {
        "enabled": False,
        "ema": 0.5,
        "unseen_weight": 1.0,
        "pools": {
            "easy": {"min": 1.0, "max": 1.0, "weight": 0.1},
            "hard": {"min": 0.0, "max": 0.0, "weight": 0.1},
            "normal": {"min": 0.0, "max": 1.0, "weight": 1.0},
        },
    },
    "dynamic_sampling": {"enabled": False, "oversample": 1.5, "max_rounds": 3, "std_tol": 1e-06},
    "eval_opponents": [],
    "legal_moves_only": False,
    "league": {
        "enabled": False,
        "self_play": 0.5,
        "snapshots": 0.3,
        "scripted": {"random": 0.2},
        "snapshot_every": 4,
        "max_snapshots": 4,
    },
}
# dtype pinned to float32 (bf16 learned less on a CPU with native bf16): ddc0558's "auto" was fp32 on every CPU
PLAIN_RUN_AT_DDC0558 = {**PLAIN_RUN_AT_DDC0558, **ADDED_SINCE_DDC0558, "dtype": "float32"}
PAPER_RUN_AT_DDC0558 = {**PAPER_RUN_AT_DDC0558, **ADDED_SINCE_DDC0558}


def test_plain_run_resolves_to_the_laptop_setting_of_ddc0558_and_the_paper_setting_is_one_flag_away():
    import mas_envs

    plain = parse_args(["--env", "math-2agent"])
    assert plain.to_dict() == PLAIN_RUN_AT_DDC0558
    assert parse_args([]).to_dict() == PLAIN_RUN_AT_DDC0558
    assert parse_args(["--train_data", "gsm8k-train"]).to_dict() == PAPER_RUN_AT_DDC0558
    # naming a model leaves the laptop layer as naming tasks does
    named = parse_args(["--model", "Qwen/Qwen3-4B"]).to_dict()
    assert named == {**PAPER_RUN_AT_DDC0558, "model": "Qwen/Qwen3-4B", "train_data": None}
    # the written-out example is the same run (its grpo section restates TRL's defaults)
    example = TrainConfig.from_yaml(EXAMPLES / "math_2agent_cpu.yaml").to_dict()
    assert {**example, "grpo": {}} == PLAIN_RUN_AT_DDC0558
    agents = list(mas_envs.make("math-2agent").possible_agents)
    groups = plain.resolve(agents).model_groups
    assert {
        g.name: (g.lora.r, g.learning_rate, g.micro_batch_size, g.base_group) for g in groups.values()
    } == {
        "solver": (16, 1e-4, 2, "solver"),
        "verifier": (16, 1e-4, 2, "solver"),
    }


def test_help_shows_what_a_plain_run_does_laptop_setting(capsys, monkeypatch):
    from mas_train.config import LAPTOP_DEFAULTS

    # the math-2agent/math-1agent notes alone (search's: their own test; math-fixer's: tests/train/test_fixer_setting.py)
    for env in ("search-3agent", "search-1agent", "math-fixer", "kuhn-poker", "tictactoe"):
        monkeypatch.delitem(LAPTOP_DEFAULTS, env)
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "What a plain run does: `mas-train --env math-2agent`" in text
    text = text.split("options:", 1)[1]  # past the usage line
    for flag, shown in [
        ("max_steps", "(default: 6; plain run of math-2agent, math-1agent: 14)"),
        ("num_generations", "(default: 4; plain run of math-2agent, math-1agent: 8)"),
        ("learning_rate", "(default: 1e-05; plain run of math-2agent, math-1agent: 0.0001)"),
        ("model_sharing", "(default: shared; plain run of math-2agent, math-1agent: shared_lora)"),
        ("sampling.max_new_tokens", "(default: 128; plain run of math-2agent, math-1agent: 32)"),
        ("lora.r", "(plain run of math-2agent, math-1agent: 16)"),
        ("env_kwargs", "(default: {}; plain run of math-2agent, math-1agent: prompt_style=fewshot)"),
    ]:
        assert shown in text.split(f"--{flag} V", 1)[1].split(" --", 1)[0], flag


def test_a_laptop_setting_for_another_env_is_data_only_laptop_setting(monkeypatch, capsys):
    """An entry in LAPTOP_DEFAULTS is all an env needs: the plain run gets it and --help shows it."""
    from mas_train.config import LAPTOP_DEFAULTS

    monkeypatch.setitem(
        LAPTOP_DEFAULTS, "search-1agent", {"max_steps": 9, "sampling": {"max_new_tokens": 64}}
    )
    monkeypatch.delitem(LAPTOP_DEFAULTS, "search-3agent")
    monkeypatch.delitem(LAPTOP_DEFAULTS, "math-fixer")
    monkeypatch.delitem(LAPTOP_DEFAULTS, "kuhn-poker")
    monkeypatch.delitem(LAPTOP_DEFAULTS, "tictactoe")
    cfg = parse_args(["--env", "search-1agent"])
    assert (cfg.max_steps, cfg.sampling.max_new_tokens, cfg.num_generations) == (9, 64, 4)
    assert parse_args(["--env", "search-1agent", "--train_data", "x.jsonl"]).max_steps == 6
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 6; plain run of math-2agent, math-1agent: 14; search-1agent: 9)" in text
