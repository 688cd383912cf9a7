"""What saving the learner's adapter costs: the save the learner makes after each
round (the worker answers no request meanwhile), its files' sizes, and the
encryption's share, the current format (AES-GCM) against the one files had
before Dec 5 (Fernet, base64). The real drafter with the app's adapter rank; the
data folder is a temporary one and no keyring is touched.

    .venv/bin/python scripts/adapter_save.py
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import keyring
from cryptography.fernet import Fernet
from keyring.backends import fail
from omnidraft.core.engine import LearnSettings
from omnidraft.core.learning.adapters import WEIGHTS_FILE, AdapterStore
from omnidraft.core.learning.learner import training_dtype
from omnidraft.core.models.catalog import SMOLLM2_ID, ModelCatalog
from omnidraft.core.models.loader import load


def timed(fn, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    keyring.set_keyring(fail.Keyring())
    os.environ["OMNIDRAFT_HOME"] = tempfile.mkdtemp(prefix="omnidraft-adapter-save-")
    drafter = load(ModelCatalog().get(SMOLLM2_ID), training_dtype())
    store = AdapterStore(Path(tempfile.mkdtemp()), drafter.model, rank=LearnSettings().rank)
    store.activate("t")
    params = sum(p.numel() for p in store.parameters("t"))
    save_s = timed(lambda: store.save("t", {"steps": 1}))
    files = {f.name: f.stat().st_size for f in store.folder("t").iterdir()}
    plain = store.keys.decrypt((store.folder("t") / WEIGHTS_FILE).read_bytes(), store.folder("t"))
    fernet = Fernet(Fernet.generate_key())
    print(f"adapter: rank {LearnSettings().rank}, {params:,} parameters, {len(plain) / 1e6:.1f} MB of weights")
    print(f"save (median of 5): {save_s:.3f} s; files: {files}")
    print(f"encrypting the weights: {timed(lambda: store.keys.encrypt(plain)):.3f} s now (AES-GCM), "
          f"{timed(lambda: fernet.encrypt(plain)):.3f} s before Dec 5 (Fernet, "
          f"{len(fernet.encrypt(plain)) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
