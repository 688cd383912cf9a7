"""Per-target LoRA adapters on the one shared drafter (OMNIDRAFT.md section 2).

The drafter learns separately for every target it serves: one LoRA adapter per
target id, switched with the target. All adapters live on ONE peft PeftModel
wrapped around the drafter, so switching is peft's set_adapter (a few dict
look-ups) and the base weights are never reloaded. An adapter is created on
first use, or restored from root/<target id>/ where an earlier session saved it.

Note: peft wraps the base model in place. Its q/k/v/o/gate/up/down modules
become LoRA layers whose `.weight` is still the base weight, and a forward of
the base model object now includes the active adapter. The lean int8 drafter is
built from `merged_state(target_id)` instead.

Saving is atomic per adapter: the files go to a temporary folder that then
replaces the old one by rename, so a crash leaves either the old adapter or
the new one, never half of each.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from peft.utils import get_peft_model_state_dict
from safetensors.torch import save as safetensors_bytes

from .persistence import _fsync_dir

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
WEIGHTS_FILE = "adapter_model.safetensors"  # the names peft's load_adapter reads
CONFIG_FILE = "adapter_config.json"
META_FILE = "omnidraft.json"  # our own counters (training steps, samples)


class AdapterStore:
    def __init__(
        self,
        root: Path,
        base_model,
        rank: int = 32,
        alpha: int = 64,
        targets: tuple[str, ...] = TARGET_MODULES,
    ):
        self.root = Path(root)
        self.base_model = base_model
        self.rank, self.alpha, self.targets = rank, alpha, tuple(targets)
        self.peft: PeftModel | None = None  # created with the first adapter
        self.active: str | None = None  # target id
        self.warnings: list[str] = []
        self._device = str(next(base_model.parameters()).device)
        self._discard_unfinished_saves()

    # ------------------------------------------------------------ adapters
    def activate(self, target_id: str) -> PeftModel:
        """The drafter with this target's adapter active (created or restored on first use)."""
        name = adapter_name(target_id)
        self._ensure(target_id)
        # self.active, not peft's active_adapter: after a reset peft still names the
        # deleted adapter, and the re-created one would stay frozen.
        if self.active != target_id or self.peft.active_adapter != name:
            self.peft.set_adapter(name)  # also makes it the only trainable adapter
        self.active = target_id
        return self.peft

    def is_loaded(self, target_id: str) -> bool:
        return self.peft is not None and adapter_name(target_id) in self.peft.peft_config

    def has_saved(self, target_id: str) -> bool:
        return (self.folder(target_id) / WEIGHTS_FILE).exists()

    def folder(self, target_id: str) -> Path:
        return self.root / folder_name(target_id)

    def parameters(self, target_id: str) -> list[torch.nn.Parameter]:
        """The adapter's LoRA parameters (what the learner optimises)."""
        self._ensure(target_id)
        name = adapter_name(target_id)
        return [p for n, p in self.peft.named_parameters() if f".{name}." in n and "lora_" in n]

    def lora_state(self, target_id: str) -> dict[str, torch.Tensor]:
        """A detached copy of the adapter's weights (tests compare before/after)."""
        self._ensure(target_id)
        state = get_peft_model_state_dict(self.peft, adapter_name=adapter_name(target_id))
        return {k: v.detach().clone() for k, v in state.items()}

    def _ensure(self, target_id: str) -> None:
        name = adapter_name(target_id)
        if self.is_loaded(target_id):
            return
        folder = self.folder(target_id)
        self._recover(folder)
        if (folder / WEIGHTS_FILE).exists():
            try:
                self._add(name, LoraConfig.from_pretrained(str(folder)))
                self.peft.load_adapter(
                    str(folder), adapter_name=name, is_trainable=True, torch_device=self._device
                )
                _fp32(self.peft, name)
                return
            except Exception as exc:  # noqa: BLE001 - any damage means: start this adapter afresh
                if self.peft is not None and name in self.peft.peft_config:
                    self.peft.delete_adapter(name)
                kept = _quarantine(folder)
                self.warnings.append(
                    f"The drafter's learned adapter for {target_id} could not be read ({exc}); "
                    f"it starts over (the damaged copy was kept as {kept.name})."
                )
        self._add(name, self._new_config())

    def _new_config(self) -> LoraConfig:
        return LoraConfig(
            r=self.rank, lora_alpha=self.alpha, target_modules=list(self.targets),
            lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
        )

    def _add(self, name: str, config: LoraConfig) -> None:
        config.inference_mode = False
        if self.peft is None:
            self.peft = get_peft_model(self.base_model, config, adapter_name=name)
            self.active = None
        else:
            self.peft.add_adapter(name, config)
        _fp32(self.peft, name)

    # ------------------------------------------------------------ persistence
    def save(self, target_id: str, meta: dict | None = None) -> None:
        """Write the adapter (and our counters) atomically to root/<target id>/."""
        self._ensure(target_id)
        name = adapter_name(target_id)
        folder = self.folder(target_id)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=self.root))
        try:
            state = {k: v.detach().contiguous() for k, v in
                     get_peft_model_state_dict(self.peft, adapter_name=name).items()}
            info = {"target_id": target_id, **self.meta(target_id), **(meta or {})}
            _write(tmp / WEIGHTS_FILE, safetensors_bytes(state))
            self.peft.peft_config[name].save_pretrained(str(tmp))  # CONFIG_FILE
            _fsync_file(tmp / CONFIG_FILE)
            _write(tmp / META_FILE, json.dumps(info, indent=2).encode())
            _fsync_dir(tmp)
            old = _old(folder)
            shutil.rmtree(old, ignore_errors=True)
            if folder.exists():
                os.replace(folder, old)  # a crash from here on is undone by _recover
            os.replace(tmp, folder)
            _fsync_dir(self.root)
            shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def meta(self, target_id: str) -> dict:
        """The counters saved with the adapter ({} when none were saved)."""
        try:
            raw = json.loads((self.folder(target_id) / META_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return raw if isinstance(raw, dict) else {}

    def reset(self, target_id: str) -> None:
        """Forget what the drafter learned for this target (memory and disk)."""
        name = adapter_name(target_id)
        if self.is_loaded(target_id):
            self.peft.delete_adapter(name)
            if self.active == target_id:
                self.active = None
        folder = self.folder(target_id)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(_old(folder), ignore_errors=True)

    def _recover(self, folder: Path) -> None:
        """A crash between save()'s two renames leaves only the previous version."""
        old = _old(folder)
        if not folder.exists() and old.exists():
            os.replace(old, folder)

    def _discard_unfinished_saves(self) -> None:
        if self.root.is_dir():
            for tmp in self.root.glob(".*.tmp"):
                shutil.rmtree(tmp, ignore_errors=True)

    # ------------------------------------------------------------ merging
    @torch.no_grad()
    def merged_state(self, target_id: str, should_stop=lambda: False) -> dict[str, torch.Tensor] | None:
        """Base weights with this adapter merged, W + B·A·(alpha/r), for every
        adapted projection, keyed like the base model's state dict
        ("model.layers.0.self_attn.q_proj.weight"). New tensors in the base
        dtype; neither the base model nor the active adapter changes. None when
        should_stop() (checked between projections) interrupted it."""
        self._ensure(target_id)
        name = adapter_name(target_id)
        out: dict[str, torch.Tensor] = {}
        for path, module in self.peft.base_model.model.named_modules():
            if not isinstance(module, LoraLayer) or name not in module.lora_A:
                continue
            if should_stop():
                return None
            base = module.get_base_layer().weight
            a = module.lora_A[name].weight.float()
            b = module.lora_B[name].weight.float()
            delta = (b @ a) * module.scaling[name]  # fp32: bf16 would round small updates away
            out[f"{path}.weight"] = (base.float() + delta).to(base.dtype)
        return out


def folder_name(target_id: str) -> str:
    """A folder name for a target id (ids may be paths holding '/', '.', spaces)."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", target_id)
    if safe == target_id and safe:
        return safe
    return f"{safe[:48]}-{hashlib.sha1(target_id.encode()).hexdigest()[:8]}"


def adapter_name(target_id: str) -> str:
    """The peft adapter name: prefixed, because peft re-initialises an adapter whose
    name is contained in its parameter prefix 'lora_' (a target called 'a')."""
    return "target-" + folder_name(target_id)


def _fp32(peft: PeftModel, name: str) -> None:
    """LoRA weights train in float32 even on a bf16 base: bf16's 8-bit mantissa
    loses lr=1e-4 updates. (peft's autocast_adapter_dtype does this too; this
    makes it independent of the peft version.)"""
    for n, p in peft.named_parameters():
        if f".{name}." in n and "lora_" in n and p.dtype != torch.float32:
            p.data = p.data.float()


def _old(folder: Path) -> Path:
    """Where save() parks the previous version between its two renames."""
    return folder.with_name(f".{folder.name}.old")


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _quarantine(folder: Path) -> Path:
    dest = folder.with_name(folder.name + ".corrupt")
    n = 1
    while dest.exists():
        dest = folder.with_name(f"{folder.name}.corrupt{n}")
        n += 1
    os.replace(folder, dest)
    return dest
