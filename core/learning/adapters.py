"""Per-target LoRA adapters on the one shared drafter (docs/method.md section 2).

The drafter learns separately for every target it serves: one LoRA adapter per
target id, switched with the target. All adapters live on ONE peft PeftModel
wrapped around the drafter, so switching is peft's set_adapter (a few dict
look-ups) and the base weights are never reloaded. An adapter is created on
first use, or restored from root/<target id>/ where an earlier session saved it.

Note: peft wraps the base model in place. Its q/k/v/o/gate/up/down modules
become LoRA layers whose `.weight` is still the base weight, and a forward of
the base model object now includes the active adapter. The lean drafter is
built from `low_rank_state(target_id)` instead.

Saving is atomic per adapter: the files go to a temporary folder that then
replaces the old one by rename, so a crash leaves either the old adapter or
the new one, never half of each (the previous version waits as .<name>.old
between the two renames and is restored from there after a crash).

The target's acceptance head (core/learning/acceptance_head.py) is saved in the
same folder, by the same atomic save: what the drafter learned and what the
head learned about it never come from two different moments.

The weights and our counters are encrypted with the data key (core.storage.secure_store):
the weights are learned from the user's chats. Only peft's adapter_config.json
(rank, alpha, module names) stays plaintext. Adapters saved as plaintext by
older versions are read once and rewritten encrypted.
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
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_bytes

from ..stopping import ShouldStop, never
from ..storage import paths
from ..storage.persistence import CorruptStateError, _fsync_dir
from ..storage.secure_store import KeyStore, KeyUnavailableError, default_keystore

LowRank = dict[str, tuple[torch.Tensor, torch.Tensor]]  # module path -> (a, b): W' = W + b @ a
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
WEIGHTS_FILE = "weights.bin"  # safetensors bytes, encrypted
META_FILE = "meta.bin"  # our own counters (training steps, samples), encrypted JSON
HEAD_FILE = "acceptance_head.bin"  # the acceptance head's safetensors bytes, encrypted
CONFIG_FILE = "adapter_config.json"  # peft's LoraConfig (hyperparameters only)
# What versions before encryption wrote in plaintext.
LEGACY_WEIGHTS_FILE = "adapter_model.safetensors"
LEGACY_META_FILE = "omnidraft.json"
COUNTERS = ("steps", "samples")
# Drafting streams the adapter's factors beside the 4-bit weights on every
# drafter forward (rank 32 on seven projections of SmolLM2: ~20 MB, 2.9 -> 4.2 ms
# a forward). The learned change rarely uses its full rank, so the drafter gets
# it truncated to the rank that keeps this share of every projection's change
# (its squared singular values): what is left out is at most ~14% of its norm.
KEEP_ENERGY = 0.98
# ... and at most this rank: cut from a trained rank-32 adapter, rank 8 kept all
# of its target tokens per step (2.45 against 2.44, 2.16 without it) for a
# quarter of the bytes (one drafter row 1.02-1.05x against 1.16-1.19x a plain
# forward; git show 524cea4:scripts/adapter_rank_eval.py).
DRAFT_MAX_RANK = 8


class AdapterStore:
    def __init__(
        self,
        root: Path,
        base_model,
        rank: int = 32,
        alpha: int = 64,
        targets: tuple[str, ...] = TARGET_MODULES,
        keys: KeyStore | None = None,
    ):
        self.root = Path(root)
        self._keys = keys
        self.base_model = base_model
        self.rank, self.alpha, self.targets = rank, alpha, tuple(targets)
        self.peft: PeftModel | None = None  # created with the first adapter
        self.active: str | None = None  # target id
        self.warnings: list[str] = []
        # Targets whose saved adapter is under a key this machine lacks: it is left
        # as it is, never overwritten this session.
        self._unsaved: set[str] = set()
        self._device = str(next(base_model.parameters()).device)
        self._tidy()

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
        folder = self.folder(target_id)
        self._recover(folder)
        return _has_weights(folder)

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
        if _has_weights(folder):
            try:
                self._load_saved(name, folder)
            except KeyUnavailableError:
                if self.peft is not None and name in self.peft.peft_config:
                    self.peft.delete_adapter(name)
                self._unsaved.add(target_id)
                self.warnings.append(
                    f"The drafter's learned adapter for {target_id} was encrypted with a key "
                    "that is not available now; it was left untouched and the drafter learns "
                    "afresh this session without saving."
                )
            except Exception as exc:  # noqa: BLE001 - any damage means: start this adapter afresh
                if self.peft is not None and name in self.peft.peft_config:
                    self.peft.delete_adapter(name)
                kept = _quarantine(folder)
                self.warnings.append(
                    f"The drafter's learned adapter for {target_id} could not be read ({exc}); "
                    f"it starts over (the damaged copy was kept as {kept.name})."
                )
            else:
                if not (folder / WEIGHTS_FILE).exists():
                    self._migrate(target_id)
                return
        self._add(name, self._new_config())

    def _load_saved(self, name: str, folder: Path) -> None:
        """Add the adapter saved in folder (encrypted, or plaintext from an older version)."""
        config = LoraConfig.from_pretrained(str(folder))
        encrypted = folder / WEIGHTS_FILE
        if encrypted.exists():
            blob = self.keys.decrypt(encrypted.read_bytes(), encrypted)
        else:
            blob = (folder / LEGACY_WEIGHTS_FILE).read_bytes()
        state = {k: v.to(self._device) for k, v in safetensors_load(blob).items()}
        self._add(name, config)
        result = set_peft_model_state_dict(self.peft, state, adapter_name=name)
        # strict=False inside peft: every base weight counts as missing; only the
        # adapter's own keys tell a complete load.
        missing = [k for k in result.missing_keys if "lora_" in k and f".{name}." in k]
        if missing or result.unexpected_keys:
            raise ValueError(
                f"{len(missing)} adapter weights missing, {len(result.unexpected_keys)} unexpected"
            )
        _fp32(self.peft, name)

    def _migrate(self, target_id: str) -> None:
        """Rewrite a plaintext adapter (older versions) encrypted; the save replaces
        the whole folder, so the plaintext files go with it."""
        try:
            self.save(target_id)
        except OSError as exc:
            self.warnings.append(f"The drafter's learned adapter for {target_id} could not be re-saved "
                                 f"encrypted ({exc}); it stays as it was.")

    @property
    def keys(self) -> KeyStore:
        if self._keys is None:
            self._keys = default_keystore()
        return self._keys

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
    def save(self, target_id: str, meta: dict | None = None, head: dict[str, torch.Tensor] | None = None) -> None:
        """Write the adapter (and our counters, and the acceptance head's state
        when given; else the saved head stays) atomically to root/<target id>/."""
        self._ensure(target_id)
        if target_id in self._unsaved:
            return  # the saved copy is under another key: never overwrite it
        name = adapter_name(target_id)
        folder = self.folder(target_id)
        paths.private_dir(self.root)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=self.root))
        try:
            state = {k: v.detach().contiguous() for k, v in
                     get_peft_model_state_dict(self.peft, adapter_name=name).items()}
            info = {"target_id": target_id, **self.meta(target_id), **(meta or {})}
            _write(tmp / WEIGHTS_FILE, self.keys.encrypt(safetensors_bytes(state)))
            self.peft.peft_config[name].save_pretrained(str(tmp))  # CONFIG_FILE
            os.chmod(tmp / CONFIG_FILE, 0o600)  # peft writes it with the umask's mode
            _fsync_file(tmp / CONFIG_FILE)
            _write(tmp / META_FILE, self.keys.encrypt(json.dumps(info).encode()))
            if head is not None:
                _write(tmp / HEAD_FILE, self.keys.encrypt(safetensors_bytes(head)))
            elif (folder / HEAD_FILE).exists():
                _write(tmp / HEAD_FILE, (folder / HEAD_FILE).read_bytes())
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
        """The counters saved with the adapter ({} when none were saved or they are
        unreadable). A damaged counters file is set aside as .corrupt and reported;
        the weights beside it are kept."""
        folder = self.folder(target_id)
        self._recover(folder)
        path = folder / META_FILE if (folder / META_FILE).exists() else folder / LEGACY_META_FILE
        try:
            blob = path.read_bytes()
            plain = self.keys.decrypt(blob, path) if path.name == META_FILE else blob
            raw = json.loads(plain.decode("utf-8"))
            if not isinstance(raw, dict):
                raise CorruptStateError(path, "it does not hold the adapter's counters")
            for key in COUNTERS:
                value = raw.get(key, 0)
                if type(value) is not int or value < 0:
                    raise CorruptStateError(path, f"{key} is not a count: {value!r}")
        except (OSError, KeyUnavailableError):  # none saved, or not readable here
            return {}
        except (CorruptStateError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            kept = CorruptStateError(path, str(exc)).quarantine()
            self.warnings.append(
                f"The learning counters of the drafter's adapter for {target_id} were damaged; "
                f"they start from zero, the learned weights are kept (the file was kept as {kept.name})."
            )
            return {}
        return raw

    def head_state(self, target_id: str) -> dict[str, torch.Tensor] | None:
        """The acceptance head saved with this target's adapter (None when none was
        saved or it is under a key this machine lacks). A damaged file is set aside
        as .corrupt and reported; the adapter beside it is kept."""
        folder = self.folder(target_id)
        self._recover(folder)
        path = folder / HEAD_FILE
        try:
            return safetensors_load(self.keys.decrypt(path.read_bytes(), path))
        except (OSError, KeyUnavailableError):
            return None
        except Exception as exc:  # noqa: BLE001 - any damage means: the head starts afresh
            aside = self.root / f"{folder.name}-{HEAD_FILE}"  # outside: a save replaces the folder
            os.replace(path, aside)
            kept = CorruptStateError(aside, str(exc)).quarantine()
            self.warnings.append(
                f"The acceptance head learned for {target_id} could not be read ({exc}); it starts "
                f"over, the drafter's adapter is kept (the damaged file was kept as {kept.name})."
            )
            return None

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
        """A crash between save()'s two renames leaves only the previous version;
        a crash after both leaves a stale previous version beside the new one."""
        old = _old(folder)
        if not old.exists():
            return
        if folder.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(old, folder)

    def _tidy(self) -> None:
        """Finish what a crash interrupted: restore parked versions, drop temporaries."""
        if not self.root.is_dir():
            return
        for tmp in self.root.glob(".*.tmp"):
            shutil.rmtree(tmp, ignore_errors=True)
        for old in self.root.glob(".*.old"):
            self._recover(self.root / old.name[1 : -len(".old")])

    # ------------------------------------------------------------ merging
    @torch.no_grad()
    def low_rank_state(self, target_id: str, should_stop: ShouldStop = never,
                       keep: float = KEEP_ENERGY, max_rank: int | None = DRAFT_MAX_RANK) -> LowRank | None:
        """This adapter's change to every adapted projection as (a, b) in float32,
        W' = W + b @ a (the LoRA scaling folded into a), keyed by module path
        ("model.layers.0.self_attn.q_proj"), truncated to one rank that keeps
        `keep` of every projection's change, at most max_rank (compact_low_rank;
        keep=1.0, max_rank=None: exact). New
        tensors: neither the base model nor the active adapter changes. None when
        should_stop() (checked between projections) interrupted it."""
        self._ensure(target_id)
        name = adapter_name(target_id)
        out: LowRank = {}
        for path, module in self.peft.base_model.model.named_modules():
            if not isinstance(module, LoraLayer) or name not in module.lora_A:
                continue
            if should_stop():
                return None
            a = module.lora_A[name].weight.float() * module.scaling[name]
            out[path] = (a.contiguous(), module.lora_B[name].weight.float().clone())
        return compact_low_rank(out, keep, max_rank)


def compact_low_rank(state: LowRank, keep: float = KEEP_ENERGY, max_rank: int | None = None) -> LowRank:
    """The same changes b @ a at one smaller rank: through each projection's SVD
    (from QR of the thin factors, cheap at rank 32), the smallest rank that keeps
    `keep` of the squared singular values of every projection, at most max_rank;
    all at one rank, as the decoder-stack kernel streams fused projections'
    parts at one rank."""
    svds = {}
    rank = 1
    for path, (a, b) in state.items():
        qb, rb = torch.linalg.qr(b)  # b = qb rb
        qa, ra = torch.linalg.qr(a.T)  # a = ra^T qa^T
        u, s, vh = torch.linalg.svd(rb @ ra.T)
        energy = (s**2).cumsum(0)
        need = int((energy < keep * energy[-1]).sum()) + 1 if energy[-1] > 0 else 1
        rank = max(rank, min(need, s.numel()))
        svds[path] = (qb @ u, s, vh @ qa.T)
    if max_rank is not None:
        rank = min(rank, max_rank)
    out: LowRank = {}
    for path, (left, s, right) in svds.items():
        if rank >= state[path][0].shape[0]:
            out[path] = state[path]
        else:  # b' = U_r S_r, a' = V_r^T
            out[path] = (right[:rank].contiguous(), (left[:, :rank] * s[:rank]).contiguous())
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


def _has_weights(folder: Path) -> bool:
    return (folder / WEIGHTS_FILE).exists() or (folder / LEGACY_WEIGHTS_FILE).exists()


def _old(folder: Path) -> Path:
    """Where save() parks the previous version between its two renames."""
    return folder.with_name(f".{folder.name}.old")


def _write(path: Path, data: bytes) -> None:
    # 0600: what the drafter learned from someone's chats is theirs alone.
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
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
