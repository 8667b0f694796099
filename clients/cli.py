"""uma-cli: talk to umad over its socket.

Exit codes: 0 success; 2 server error (an error event, or the daemon unreachable);
3 protocol error (the daemon rejected the request as malformed, E_PROTO_*, or sent a frame
the client cannot decode).
"""

from __future__ import annotations

import argparse
import json
import sys

import msgspec

from uma_serve.clients.client import DEFAULT_SOCKET, CoreError, UmaClient, new_id
from uma_serve.core import protocol as p

EXIT_OK, EXIT_SERVER, EXIT_PROTOCOL = 0, 2, 3
DEFAULTS = p.Sampling()  # the core's own sampling defaults

BASE_MODEL_NOTE = (
    "uma-cli: note: the served GGUF has no chat template of its own: likely a base model "
    "(as the embedded Gemma 3 270M, a small model for trying the server), whose chat answers "
    "are continuations, not replies. Serve an instruction-tuned GGUF with umad --model PATH."
)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="uma-cli", description="Client for the UMA Serve daemon.")
    ap.add_argument("--socket", default=DEFAULT_SOCKET, help="daemon socket (env UMA_SOCKET)")
    ap.add_argument("--prompt", help="prompt text (default: read stdin)")
    ap.add_argument("--chat", action="store_true", help="send the prompt as a user chat message")
    ap.add_argument("--system", help="system message for --chat")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument(
        "--temp", type=float, default=DEFAULTS.temperature, help="temperature (0: greedy)"
    )
    ap.add_argument("--top-p", type=float, default=DEFAULTS.top_p)
    ap.add_argument("--top-k", type=int, default=DEFAULTS.top_k)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--stop", action="append", help="stop string (repeatable)")
    ap.add_argument("--qos", choices=["interactive", "background"], default="interactive")
    ap.add_argument("--no-stream", action="store_true", help="one answer frame instead of tokens")
    ap.add_argument("--usage", action="store_true", help="print usage and timings to stderr")
    ap.add_argument("--metrics", action="store_true", help="print the metrics snapshot (JSON)")
    ap.add_argument("--info", action="store_true", help="print model and daemon info (JSON)")
    ap.add_argument("--health", action="store_true", help="print the daemon's health (JSON)")
    return ap


def _print_json(obj: object) -> None:
    print(json.dumps(msgspec.to_builtins(obj), indent=2))


def run(args: argparse.Namespace) -> int:
    with UmaClient(args.socket) as client:
        if _answered_query(client, args):
            return EXIT_OK
        text = args.prompt if args.prompt is not None else sys.stdin.read()
        fields = _prompt_fields(client, args, text)
        try:
            request = _generate(args, fields)
        except (msgspec.ValidationError, ValueError) as exc:
            print(f"uma-cli: invalid request: {exc}", file=sys.stderr)
            return EXIT_PROTOCOL
        final = _write_stream(client, request)
        if final is not None and args.usage:
            info = {"usage": final.usage, "timings": final.timings, "reason": final.reason}
            print(json.dumps(msgspec.to_builtins(info)), file=sys.stderr)
        if final is not None and final.reason == "error":
            return EXIT_SERVER
    return EXIT_OK


def _answered_query(client: UmaClient, args: argparse.Namespace) -> bool:
    """--metrics, --info or --health: print the core's answer as JSON (then True)."""
    if args.metrics:
        _print_json(client.metrics())
        return True
    if args.info:
        _print_json(client.info())
        return True
    if args.health:
        _print_json(client.health())
        return True
    return False


def _prompt_fields(client: UmaClient, args: argparse.Namespace, text: str) -> dict[str, object]:
    """``messages`` (--chat, after --system if given) or ``prompt``."""
    fields: dict[str, object] = {}
    if args.chat:
        if not client.info().gguf_chat_template:
            print(BASE_MODEL_NOTE, file=sys.stderr)
        msgs = [p.Message("system", args.system)] if args.system else []
        fields["messages"] = [*msgs, p.Message("user", text)]
    else:
        fields["prompt"] = text
    return fields


def _generate(args: argparse.Namespace, fields: dict[str, object]) -> p.Generate:
    return p.Generate(
        id=new_id(),
        max_tokens=args.max_tokens,
        temperature=args.temp,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop,
        stream=not args.no_stream,
        qos=args.qos,
        **fields,  # type: ignore[arg-type]
    )


def _write_stream(client: UmaClient, request: p.Generate) -> p.CompletionEvent | p.EosEvent | None:
    """The answer's text to stdout as it arrives, then a newline; the final event."""
    final = None
    for event in client.stream(request):
        if isinstance(event, p.TokenEvent):
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif isinstance(event, p.CompletionEvent):
            sys.stdout.write(event.text)
            final = event
        elif isinstance(event, p.EosEvent):
            final = event
    sys.stdout.write("\n")
    return final


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        code = run(args)
    except CoreError as exc:
        print(f"uma-cli: {exc}", file=sys.stderr)
        code = EXIT_PROTOCOL if exc.code.startswith(("E_PROTO", "E_TEMPLATE")) else EXIT_SERVER
    except (FileNotFoundError, ConnectionRefusedError, PermissionError) as exc:
        print(f"uma-cli: cannot reach the daemon at {args.socket}: {exc}", file=sys.stderr)
        code = EXIT_SERVER
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        print(f"uma-cli: protocol error: {exc}", file=sys.stderr)
        code = EXIT_PROTOCOL
    raise SystemExit(code)


if __name__ == "__main__":
    main()
