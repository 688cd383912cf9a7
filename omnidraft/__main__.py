"""`omnidraft` console command: the desktop app, or `omnidraft serve`: the local
OpenAI-compatible server without a window."""

from __future__ import annotations

import argparse
import multiprocessing
import sys

from omnidraft import __version__


def main(argv: list[str] | None = None) -> int:
    # First of all: in the frozen bundle the engine worker (a "spawn" process) is this
    # same executable started again, and this hands it to multiprocessing (a no-op
    # anywhere else).
    multiprocessing.freeze_support()
    parser = argparse.ArgumentParser(prog="omnidraft", description="OmniDraft Desktop")
    parser.add_argument("--version", action="version", version=f"omnidraft {__version__}")
    parser.add_argument("--target", help="catalog id or model path to open first")
    commands = parser.add_subparsers(dest="command", metavar="{serve}")
    serve = commands.add_parser(
        "serve", help="serve the target over an OpenAI-compatible API (no window)",
        description="Serve the target over an OpenAI-compatible API at http://HOST:PORT/v1, "
                    "drafted by OmniDraft, until Ctrl-C.")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: this machine only; "
                            "any other needs --api-key)")
    serve.add_argument("--port", type=_port, default=8090, help="port (default 8090; 0: any free one)")
    serve.add_argument("--api-key", help="key clients must send as 'Authorization: Bearer KEY' "
                                         "(or set OMNIDRAFT_API_KEY)")
    serve.add_argument("--model", help="catalog id or model path to serve (default: the app's last target)")
    serve.add_argument("--learn", action=argparse.BooleanOptionalAction, default=None,
                       help="learn from the served turns (default: the app's setting, off unless turned on)")
    args = parser.parse_args(argv)
    if args.command == "serve":
        from omnidraft.server.runner import serve as run_server  # no Qt

        return run_server(args.host, args.port, args.api_key, model=args.model or args.target, learn=args.learn)
    from omnidraft.app.main import run_app  # Qt imported only when the GUI starts

    return run_app(target=args.target)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"the port must be from 0 to 65535, not {port}")
    return port


if __name__ == "__main__":
    sys.exit(main())
