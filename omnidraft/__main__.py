"""`omnidraft` console command: the desktop app."""

from __future__ import annotations

import argparse
import sys

from omnidraft import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnidraft", description="OmniDraft Desktop")
    parser.add_argument("--version", action="version", version=f"omnidraft {__version__}")
    parser.add_argument("--target", help="catalog id or model path to open first")
    args = parser.parse_args(argv)
    from omnidraft.app.main import run_app  # Qt imported only when the GUI starts

    return run_app(target=args.target)


if __name__ == "__main__":
    sys.exit(main())
