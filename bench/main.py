"""bench: measure UMA Serve (and its peers). One subcommand per scenario; `bench X --help`."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module under uma_serve.bench that defines add_arguments(parser) and run(args)
SCENARIOS: dict[str, str] = {
    "solo": "solo",
    "storm": "storm",
    "chat-vs-paste": "chat_vs_paste",
    "agent-chain": "agent_chain",
    "mixed-load": "mixed_load",
    "long-ctx": "long_ctx",
    "sweep": "sweep",
    "ipc-overhead": "ipc_overhead",
    "engine": "engine",
    "calibrate": "calibrate",
    "peers": "peers",
    "shared-prefix": "shared_prefix",
    "repetitive": "repetitive",
    "warm-floor": "warm_floor",
    "floor": "floor",
    "grammar-mix": "grammar_mix",
    "conversation": "conversation",
    "ceiling": "ceiling",
    "synth-model": "synth_model",
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bench", description=__doc__)
    sub = ap.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    modules = {}
    for name, module_name in SCENARIOS.items():
        module = importlib.import_module(f"uma_serve.bench.{module_name}")
        modules[name] = module
        sp = sub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        module.add_arguments(sp)
    args = ap.parse_args(argv)
    sys.exit(modules[args.scenario].run(args) or 0)


if __name__ == "__main__":
    main()
