"""How long the bundled models take to load from their converted cache.

Usage: python scripts/load_times.py   (run once before to convert; it reports both)
"""

from __future__ import annotations

import time

from omnidraft.core.models.catalog import BUNDLED
from omnidraft.core.models.loader import is_complete, load, weights_folder


def main() -> None:
    import transformers  # noqa: F401 - imported up front so its start-up is not counted

    for entry in BUNDLED.values():
        start = time.perf_counter()
        folder = weights_folder(entry)  # converts on first use only
        first = time.perf_counter() - start
        assert is_complete(folder)
        start = time.perf_counter()
        load(entry)
        print(f"{entry.id}: cached load {time.perf_counter() - start:.2f} s"
              f" (conversion check/first use {first:.2f} s)")


if __name__ == "__main__":
    main()
