"""TrainConfig: resolution of agents to model groups, start-up checks, YAML and CLI views."""

from __future__ import annotations

import dataclasses
import re

import pytest

from mas_train.backends.base import SamplingParams
from mas_train.config import (
    AgentConfig,
    ConfigError,
    ModelGroupConfig,
    SamplingConfig,
    TrainConfig,
    build_parser,
    parse_args,
)

AGENTS = ["solver", "verifier"]
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
    )
    kwargs = cfg.resolve(AGENTS).model_groups["shared"].grpo_config_kwargs()
    args = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **kwargs)
    assert (args.loss_type, args.epsilon_high, args.num_iterations, args.learning_rate) == (
        "grpo",
        0.28,
        2,
        1e-5,
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
    assert r.agents["verifier"].sampling_params(eval=True).temperature == 0.6
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
    assert cfg.agents["verifier"].sampling == SamplingConfig(temperature=0.7, top_p=0.9)
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
    assert g.backend_kwargs == {"mem_fraction_static": 0.45}  # the deprecated view: options set away from default
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
        if f.name not in ("agents", "model_groups", "sampling", "eval_sampling"):
            assert f"--{f.name}" in flags, f.name
