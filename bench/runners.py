"""The methods `omnidraft-bench` times, each a Runner: prompt text in, token ids out.

  target     this engine's plain decoding (Engine.complete)
  hf         transformers model.generate() alone
  uag        transformers assisted generation with the drafter as assistant_model
             (Universal Assisted Generation when the vocabularies differ)
  omnidraft  this engine's speculative decoding (Engine.complete(..., speculative=True))
  llamacpp, llamacpp-ngram, llamacpp-draft
             llama.cpp's server on the same GGUF file: plain, with prompt-lookup
             (n-gram) speculation, and with a same-family draft model (bench/llamacpp.py)

Variants of omnidraft are not methods of their own name but settings (DraftVariant,
`--draft KEY=VALUE,...`), each run as the method `omnidraft[KEY=VALUE,...]`:

  k=N        drafting exactly N drafter tokens per drafter step (1 to 16; no stop
             rule: neither the confidence nor the acceptance head cuts a draft short),
             the fixed draft lengths adaptive drafting must beat
  max_k=N    the engine's stop rules with at most N drafter tokens per step
  priced=0   drafting without priced stops (DraftPrices): the fixed confidence rule
             they replace
  drawn=1    under sampling, drafts drawn from the drafter's distribution (accepted
             with min(1, p/q')) instead of its most likely tokens (point masses
             accepted with the target's p(t))
  read=N     the drafter reads at most N of the prompt's tokens: its first and the
             most recent (1 to 4096)
  head_bits=4|8  the drafter's LM head in 4 bits (the default beside 4-bit layers)
             or int8: what a drafted token costs against what it drafts
  head_tokens=N  the drafter's LM head over its first N token ids (256 to 65536;
             the default 32,768, DraftSettings.head_tokens; BPE ids run roughly by
             frequency): fewer bytes a drafted token against the proposals above N
             it cannot make; in 4 bits unless head_bits says otherwise
  layers=N   drafting with the drafter's first N layers only (then its final norm
             and LM head), untrained for it; refused while an adapter is loaded
  q4k=1      the drafter's 4-bit layers and head rounded onto Q4_K's grid (4.5 bits
             a weight) instead of its file's Q4_1 (5); refused while an adapter is loaded
  untrained=1  omnidraft as a fresh install drafts for the target: a drafter of its
             own on the shipped weights, without the learned adapter, acceptance
             head, n-gram merges and drafting state; beside omnidraft on a
             --state-dir's learned state, what learning gave in one run

Settings combine (`--draft k=3,head_bits=8`), but for k with max_k or priced.

Every method is timed with the same wall clock around one whole call, prompt text
in, token ids out; methods run interleaved prompt by prompt so machine drift hits
all alike. A method that raises is recorded with its error and left out of the
rest of the run; the others go on. tokens_per_step is new tokens per target
forward call (prompt forward included), counted by a hook on the target's input
embeddings: one definition for the engine and for transformers, so the peers
compare. Plain decoding gives 1.0.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch
from omnidraft.core.decoding.adaptive_drafting import DraftPolicy
from omnidraft.core.decoding.drafter import Drafter
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine
from omnidraft.core.engine_api import EngineAPI
from omnidraft.core.events import TurnFinished, TurnStats
from omnidraft.core.kernels.layouts import Q4_K
from omnidraft.core.learning.acceptance_head import AcceptanceHead
from omnidraft.core.models.catalog import SMOLLM2_ID, ModelCatalog
from omnidraft.core.models.chat_format import encode_chat, stop_token_ids
from omnidraft.core.models.lean_llama import DraftLinear, LeanLlama
from omnidraft.core.models.loader import LoadedModel, load, source_path

PEERS = ("llamacpp", "llamacpp-ngram", "llamacpp-draft")
METHODS = ("target", "hf", "uag", "omnidraft", *PEERS)
# "int4": bf16 with a GGUF's Q4_K layers in 4 bits and the rest int8 (the app's default,
# core/kernels/); "int8": every large linear layer int8 (core/models/quantize.py).
DTYPES = {"int4": torch.bfloat16, "int8": torch.bfloat16, "bf16": torch.bfloat16, "fp32": torch.float32}
# A neutral warm-up text: the engine may learn from what it decodes, and the
# warm-up must not hand it a benchmark prompt's continuation in advance.
WARMUP_PROMPT = "The quick brown fox"
WARMUP_TOKENS = 4


class BenchError(Exception):
    """A problem with the command line or the inputs; printed without a traceback."""


# KEY: (lowest, highest) for the integer settings, (0, 1) for the flags.
DRAFT_KEYS = {
    "k": (1, 16), "max_k": (1, 16), "priced": (0, 1), "drawn": (0, 1), "read": (1, 4096),
    "head_bits": (4, 8), "head_tokens": (256, 65536), "layers": (1, 99), "q4k": (0, 1), "untrained": (0, 1),
}
FLAGS = ("priced", "drawn", "q4k", "untrained")


@dataclass(frozen=True)
class DraftVariant:
    """One `--draft KEY=VALUE,...`: the settings omnidraft runs with as a method of
    its own. None: the engine's own setting. `given` keeps the keys in the order
    the user wrote them, for the method's label."""

    k: int | None = None
    max_k: int | None = None
    priced: bool | None = None
    drawn: bool | None = None
    read: int | None = None
    head_bits: int | None = None
    head_tokens: int | None = None
    layers: int | None = None
    q4k: bool = False
    untrained: bool = False
    given: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> DraftVariant:
        """`k=3,head_bits=8` -> DraftVariant(k=3, head_bits=8); ValueError says what is wrong."""
        values: dict = {}
        for part in text.split(","):
            key, sep, raw = (x.strip() for x in part.partition("="))
            if not sep or not key or not raw:
                raise ValueError(f"{part.strip()!r} is not KEY=VALUE")
            if key not in DRAFT_KEYS:
                raise ValueError(f"unknown key {key!r}; keys: {', '.join(DRAFT_KEYS)}")
            if key in values:
                raise ValueError(f"{key} given twice")
            try:
                value = int(raw)
            except ValueError:
                raise ValueError(f"{key}={raw}: not an integer") from None
            low, high = DRAFT_KEYS[key]
            if key == "head_bits" and value not in (4, 8):
                raise ValueError("head_bits must be 4 or 8")
            if not low <= value <= high:
                raise ValueError(f"{key} must be {'0 or 1' if key in FLAGS else f'from {low} to {high}'}, not {value}")
            values[key] = bool(value) if key in FLAGS else value
        if "k" in values and "max_k" in values:
            raise ValueError("k (a fixed draft length) and max_k (a cap on the stop rules' length) exclude each other")
        if "k" in values and values.get("priced"):
            raise ValueError("k drafts a fixed length without stop rules: priced=1 does not apply")
        return cls(**values, given=tuple(values))

    @property
    def settings(self) -> dict:
        """The keys given, with their values as written (flags as 0/1)."""
        return {key: int(getattr(self, key)) for key in self.given}

    @property
    def label(self) -> str:
        return "omnidraft[" + ",".join(f"{k}={v}" for k, v in self.settings.items()) + "]"

    def draft_overrides(self) -> dict:
        """The engine's DraftSettings fields this variant swaps in for a call."""
        out: dict = {}
        if self.k is not None:  # no stop rule cuts a fixed-length draft short
            out |= {"k": self.k, "min_confidence": 0.0, "gamma": None, "priced": False}
        if self.max_k is not None:
            out["k"] = self.max_k
        if self.priced is not None and self.k is None:
            out["priced"] = self.priced
        if self.read is not None:
            out["prompt_tokens"] = self.read
        if self.drawn is not None:
            out["draw_drafts"] = self.drawn
        return out

    def net_args(self) -> dict:
        """LeanLlama arguments of another build of the drafter's net (none: its own)."""
        return ({"num_layers": self.layers} if self.layers is not None else {}) | (
            {"layout": Q4_K} if self.q4k else {})


def draft_variant_arg(text: str) -> DraftVariant:
    """argparse type of --draft: a bad key or value is a usage error (exit 2)."""
    try:
        return DraftVariant.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def error_record(exc: BaseException, prompt_index: int | None) -> dict:
    """What the report keeps of a method's failure: enough to find it again."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "prompt_index": prompt_index,  # None: it failed in its warm-up, before any prompt
        "where": "".join(traceback.format_exception(exc)[-3:]).strip()[-2000:],
    }


@dataclass
class Output:
    """One method's result on one prompt."""

    token_ids: list[int]
    seconds: float  # wall clock around the whole call
    forwards: int  # target forward calls, prompt forward included
    stats: TurnStats | None = None  # the engine's own accounting (engine methods only)
    peer: dict | None = None  # a peer's own accounting (llama.cpp's server timings)


# A runner returns the token ids and its own accounting: the engine's TurnStats,
# a peer's dict, or None.
Runner = Callable[[str, GenerationConfig], tuple[list[int], TurnStats | dict | None]]


@dataclass
class Method:
    name: str
    run: Runner
    forwards_reliable: bool = True
    outputs: list[Output] = field(default_factory=list)
    # A method that does not run the torch target counts its own forwards here.
    own_forwards: list[int] | None = None
    # What it ran with, into the report: a DraftVariant's keys, a peer's flags.
    settings: dict = field(default_factory=dict)
    # Set when it raised (error_record); it then runs no further prompt.
    error: dict | None = None
    # Stops what it started (a peer's server); called once the run is over.
    close: Callable[[], None] | None = None


def as_chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def prompt_ids(tokenizer, prompt: str, chat: bool = False) -> list[int]:
    # Exactly how Engine.chat / Engine.complete tokenize, so every method decodes the same ids.
    if chat:
        return encode_chat(tokenizer, as_chat(prompt))
    return tokenizer(prompt, split_special_tokens=True)["input_ids"]


def trim(ids: list[int], stops: set[int], max_new_tokens: int) -> list[int]:
    """The engine's reply semantics: cut before the first stop id, at most max_new_tokens.

    generate() keeps the eos it stopped on, and assisted generation can accept
    tokens past it within one verified block.
    """
    for i, tok in enumerate(ids):
        if tok in stops:
            ids = ids[:i]
            break
    return ids[:max_new_tokens]


def keep_shared_context(engine: EngineAPI, previous: str | None, chat: bool) -> None:
    """The caches a user's app holds when the next prompt follows the previous one:
    the target's and the drafter's keep only what the two prompts share at the start
    (the chat template's system turn), as llama.cpp's own cache does between its
    prompts. So no method reuses another method's read of the same prompt. Whichever
    of the two a cache last read, it keeps here what it shares with the previous
    prompt, and the next prefill what of that the next prompt shares."""
    caches = []
    if (target := getattr(engine, "target", None)) is not None:
        caches.append((target.tokenizer, target.runner.cache))
    if (drafter := getattr(engine, "drafter", None)) is not None:
        caches.append((drafter.tokenizer, drafter.net))
    for tokenizer, net in caches:
        if previous is None:
            net.reset()
        else:
            net.reuse(prompt_ids(tokenizer, previous, chat), compute=0)


def prompt_events(engine: EngineAPI, prompt: str, cfg: GenerationConfig, speculative: bool, chat: bool):
    """The engine's events for one prompt: as a user message through the chat
    templates (Engine.chat, the app's path) or as a raw completion."""
    if chat:
        return engine.chat(as_chat(prompt), cfg, speculative=speculative)
    return engine.complete(prompt, cfg, speculative=speculative)


def engine_runner(engine: EngineAPI, speculative: bool, chat: bool = False) -> Runner:
    previous: list[str] = []  # the prompt this method ran last

    def run(prompt: str, cfg: GenerationConfig) -> tuple[list[int], TurnStats | None]:
        keep_shared_context(engine, previous[-1] if previous else None, chat)
        previous[:] = [prompt]
        done = [e for e in prompt_events(engine, prompt, cfg, speculative, chat) if isinstance(e, TurnFinished)]
        if not done:
            raise RuntimeError("the engine finished without a TurnFinished event")
        stats = done[-1].stats
        if speculative and stats.method != "omnidraft":
            # The engine falls back to plain decoding when its drafter is off; timing
            # that as "omnidraft" would be a false figure.
            why = "; ".join(engine.warnings) or "no drafter loaded"
            raise BenchError(f"method 'omnidraft': the engine decoded plainly ({why})")
        return list(done[-1].token_ids), stats

    return run


@contextmanager
def swapped(obj, **values) -> Iterator[None]:
    """obj's attributes set to values inside the block, their own restored after."""
    saved = {name: getattr(obj, name) for name in values}
    for name, value in values.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(obj, name, value)


def own_policy(engine: Engine, run: Runner, policy: DraftPolicy | None = None) -> Runner:
    """run with adaptive drafting's own state (core/decoding/adaptive_drafting.py:
    prices, calibration, per-source rates), `policy` or a copy of the engine's as
    it stood, swapped in for each call. Sharing the engine's, a variant that drafts
    worse taught omnidraft to draft less: beside two shortened drafters it drafted
    1.86 tokens a step instead of 2.31 (docs/drafter.md)."""
    policy = policy if policy is not None else copy.deepcopy(engine.draft_policy)

    def wrapped(prompt: str, cfg: GenerationConfig) -> tuple[list[int], TurnStats | None]:
        with swapped(engine, draft_policy=policy):
            return run(prompt, cfg)

    return wrapped


def variant_runner(engine: Engine, variant: DraftVariant, chat: bool = False) -> Runner:
    """omnidraft with a DraftVariant's settings swapped into the engine for each call
    and the engine's own restored after, each part on what the part before left:
    untrained, the engine's drafter (with its adapter, acceptance head and n-gram
    merges) replaced by one of its own on the shipped weights; layers / q4k, that
    drafter's net replaced by another build; head_bits / head_tokens, that net's LM
    head replaced; last, the draft settings (DraftVariant.draft_overrides). Every
    variant learns a drafting policy of its own (own_policy): sharing the engine's,
    a variant that drafts worse taught omnidraft to draft less."""
    speculative = engine_runner(engine, True, chat)
    overrides = variant.draft_overrides()
    net_args = variant.net_args()
    own: list[Drafter] = []  # built on the first call, once the engine's drafter is loaded
    nets: dict[int, LeanLlama] = {}  # id(the net it replaces) -> another build of it
    heads: dict[int, DraftLinear] = {}  # id(the net it goes into) -> the head

    def other_net(drafter: Drafter) -> LeanLlama:
        full = drafter.net
        if id(full) not in nets:
            nets[id(full)] = LeanLlama(engine.drafter_model.model, max_len=full.max_len, int8=full.int8,
                                       int4=full.int4, head_rows=full.head.out_features, **net_args)
        return nets[id(full)]

    def head(net: LeanLlama) -> DraftLinear:
        if id(net) not in heads:
            weight = engine.drafter_model.model.get_output_embeddings().weight
            rows = variant.head_tokens or net.head.out_features  # head_bits alone: as many ids as its own head
            bits = variant.head_bits or 4
            heads[id(net)] = DraftLinear(weight[:rows].detach().to(net.dtype).contiguous(), None, True, bits == 4)
        return heads[id(net)]

    def run(prompt: str, cfg: GenerationConfig) -> tuple[list[int], TurnStats | None]:
        with ExitStack() as stack:
            if variant.untrained:
                if not own:
                    drafter = Drafter(engine.drafter_model, engine.draft_settings, max_len=engine.drafter.max_len)
                    drafter.head = AcceptanceHead(engine.drafter_model.model.config.hidden_size)
                    own.append(drafter)
                # Its own drafter keeps its own cache, so like omnidraft it reads only
                # what a prompt does not share with the previous one.
                stack.enter_context(swapped(engine, drafter=own[0]))
                stack.enter_context(swapped(engine.bridge.cache, entries=OrderedDict()))
            drafter = engine.drafter
            if net_args:
                if drafter.adapter_rank is not None:
                    raise BenchError(f"{variant.label} drafts without the target's adapter; run it before any learning")
                # The drafter's context lives in its net's cache: empty it on each swap.
                drafter.forget_context()
                stack.enter_context(swapped(drafter, net=other_net(drafter)))
                stack.callback(drafter.forget_context)  # runs before the net is swapped back
            if variant.head_bits is not None or variant.head_tokens is not None:
                net = drafter.net
                stack.enter_context(swapped(net, head=head(net)))
            stack.enter_context(swapped(engine.draft_settings, **overrides))
            return speculative(prompt, cfg)

    return own_policy(engine, run, DraftPolicy() if variant.untrained else None)


def hf_runner(target: LoadedModel, assistant: LoadedModel | None = None, chat: bool = False) -> Runner:
    """transformers generate() on the target, optionally assisted by a drafter."""
    model, tok = target.model, target.tokenizer
    stops = stop_token_ids(tok, model)  # the stop ids the engine uses
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(stops, default=0)
    extra: dict = {}
    if assistant is not None:
        extra["assistant_model"] = assistant.model
        # transformers decides "different tokenizers" by vocabulary size; follow it.
        if model.config.get_text_config().vocab_size != (
            assistant.model.config.get_text_config().vocab_size
        ):
            extra.update(tokenizer=tok, assistant_tokenizer=assistant.tokenizer)

    @torch.inference_mode()
    def run(prompt: str, cfg: GenerationConfig) -> tuple[list[int], TurnStats | None]:
        ids = prompt_ids(tok, prompt, chat)
        x = torch.tensor([ids], dtype=torch.long)
        sampling: dict = {"do_sample": False}
        if not cfg.greedy:
            # The engine samples from the full distribution (top-p only): no top-k.
            sampling = {
                "do_sample": True,
                "temperature": cfg.temperature,
                "top_p": cfg.top_p,
                "top_k": 0,
            }
            torch.manual_seed(cfg.seed if cfg.seed is not None else 0)
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=cfg.max_new_tokens,
            eos_token_id=sorted(stops) or None,
            pad_token_id=pad,
            **sampling,
            **extra,
        )
        return trim(out[0, len(ids) :].tolist(), stops, cfg.max_new_tokens), None

    return run


def uag_drafter(
    engine: EngineAPI, dtype: torch.dtype, catalog: ModelCatalog, drafter_id: str | None = None
) -> LoadedModel:
    """The engine's drafter when it has one, else the bundled SmolLM2; always a private copy.

    transformers prunes the assistant's LM head in place when sampling and keeps
    its draft-length heuristic on the assistant between calls: the engine's own
    drafter must not be touched by that. (engine.drafter_model is the transformers model
    as loaded; the engine drafts with its own lean copy of the weights.)
    """
    own = engine.drafter_model
    if own is None:
        return load(catalog.get(drafter_id or SMOLLM2_ID), dtype)
    return LoadedModel(own.entry, copy.deepcopy(own.model), own.tokenizer, 0.0)


def shares_embeddings(engine: EngineAPI) -> bool:
    """True when the engine's drafter calls the target's embedding module (self-drafting).

    Then the forward counter would count drafter calls as target forwards.
    """
    if engine.drafter_model is None:
        return False
    return engine.drafter_model.model.get_input_embeddings() is engine.target.model.get_input_embeddings()


@contextmanager
def count_forwards(model) -> Iterator[list[int]]:
    """Counts target forward calls: every forward embeds its input ids exactly once."""
    calls = [0]

    def hook(*_args) -> None:
        calls[0] += 1

    handle = model.get_input_embeddings().register_forward_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def timed(method: Method, target_model, prompt: str, cfg: GenerationConfig) -> Output:
    calls = method.own_forwards
    before = calls[0] if calls else 0
    with count_forwards(target_model) as hooked:
        start = time.perf_counter()
        ids, stats = method.run(prompt, cfg)
        seconds = time.perf_counter() - start
    forwards = calls[0] - before if calls else hooked[0]
    if isinstance(stats, dict):
        return Output(ids, seconds, forwards, None, stats)
    return Output(ids, seconds, forwards, stats)


def prompt_config(args: argparse.Namespace, index: int) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed + index
    )


def warm_up(method: Method) -> None:
    """One short untimed generation: first-call overheads (allocations, lazy init)
    stay out. It is also where a method that cannot run here fails, before any
    timing: recorded on the method, which then takes no part in the run."""
    if method.error is not None:
        return
    try:
        method.run(WARMUP_PROMPT, GenerationConfig(max_new_tokens=WARMUP_TOKENS))
    except Exception as exc:  # noqa: BLE001 - any failure is the method's, recorded
        fail(method, exc, None)


def fail(method: Method, exc: BaseException, prompt_index: int | None) -> None:
    method.error = error_record(exc, prompt_index)
    where = "in its warm-up" if prompt_index is None else f"on prompt {prompt_index + 1}"
    print(f"method '{method.name}' failed {where}: {type(exc).__name__}: {exc}; the others go on",
          file=sys.stderr, flush=True)


def run_interleaved(
    methods: list[Method], target_model, prompts: list[dict], args: argparse.Namespace
) -> None:
    """For each prompt, each method in turn, so drift of the machine hits all alike.
    A method that raises is recorded as failed and skipped from then on."""
    for i, row in enumerate(prompts):
        cfg = prompt_config(args, i)
        line = []
        for m in methods:
            if m.error is not None:
                continue
            try:
                out = timed(m, target_model, row["prompt"], cfg)
            except Exception as exc:  # noqa: BLE001 - any failure is the method's, recorded
                fail(m, exc, i)
                line.append(f"{m.name} failed")
                continue
            m.outputs.append(out)
            line.append(f"{m.name} {len(out.token_ids)} tok {out.seconds:.2f} s")
        print(f"prompt {i + 1}/{len(prompts)}: " + ", ".join(line), file=sys.stderr, flush=True)


def close_methods(methods: list[Method]) -> None:
    """Stop what the methods started (llama.cpp's servers); a failure to stop is no reason to lose the report."""
    for m in methods:
        if m.close is not None:
            try:
                m.close()
            except Exception as exc:  # noqa: BLE001
                print(f"method '{m.name}': stopping it failed: {exc}", file=sys.stderr, flush=True)


def building(name: str, make: Callable[[], Method]) -> Method:
    """make() a method; one that cannot even be built is a failed method of the run."""
    try:
        return make()
    except BenchError:
        raise  # a usage problem (a peer not installed): the whole run stops, naming it
    except Exception as exc:  # noqa: BLE001
        method = Method(name, lambda *_: ([], None))
        fail(method, exc, None)
        return method


def build_methods(
    args: argparse.Namespace, engine: EngineAPI, catalog: ModelCatalog
) -> tuple[list[Method], str | None]:
    """Runners in the order asked (then the --draft variants), warmed up; uag last
    so a lazily loaded drafter exists."""
    made: dict[str, Method] = {}
    if "target" in args.methods:
        made["target"] = Method("target", engine_runner(engine, False, args.chat))
    if "hf" in args.methods:
        made["hf"] = Method("hf", hf_runner(engine.target, chat=args.chat))
    if "omnidraft" in args.methods:
        made["omnidraft"] = Method("omnidraft", engine_runner(engine, True, args.chat))
    for variant in args.draft:
        made[variant.label] = Method(variant.label, variant_runner(engine, variant, args.chat),
                                     settings=variant.settings)
    drafting = [m for m in made.values() if m.name.startswith("omnidraft")]
    for m in made.values():
        warm_up(m)
    for m in drafting:
        m.forwards_reliable = not shares_embeddings(engine)
    # The drafter is named only when a method used it (the engine may load one anyway).
    drafter = engine.drafter_model.entry if engine.drafter_model is not None else None
    name = drafter.name if drafter and drafting else None
    for peer in PEERS:
        if peer in args.methods and (method := building(peer, lambda p=peer: llamacpp_method(p, engine, catalog, args))):
            made[peer] = method
            warm_up(method)
    if "uag" in args.methods:
        def make_uag() -> Method:
            assistant = uag_drafter(engine, DTYPES[args.dtype], catalog, args.drafter)
            method = Method("uag", hf_runner(engine.target, assistant, args.chat))
            method.settings = {"assistant": assistant.entry.name}
            return method

        made["uag"] = building("uag", make_uag)
        warm_up(made["uag"])
        name = name or made["uag"].settings.get("assistant")
    order = [*args.methods, *(v.label for v in args.draft)]
    return [made[m] for m in order if m in made], name


def llamacpp_method(name: str, engine: EngineAPI, catalog: ModelCatalog, args: argparse.Namespace) -> Method:
    """llama.cpp's server on the target's own GGUF file (bench/llamacpp.py).
    Missing llama.cpp is an error naming `make peers`."""
    from . import llamacpp

    target = engine.target
    gguf = source_path(target.entry)
    if gguf.suffix.lower() != ".gguf":
        raise ValueError(f"{name} needs a GGUF target; {target.entry.name} is read from {gguf.name}")
    if llamacpp.build_info() is None:
        raise BenchError(llamacpp.INSTALL_HINT)
    draft = None
    if name == "llamacpp-draft":
        draft_id = llamacpp.DRAFT_MODELS.get(target.entry.id)
        if draft_id is None:
            raise ValueError(f"no same-family draft model for {target.entry.id} "
                             f"(known: {', '.join(llamacpp.DRAFT_MODELS) or 'none'})")
        draft = source_path(catalog.get(draft_id))
    stops = stop_token_ids(target.tokenizer, target.model)
    server = llamacpp.Server(gguf, llamacpp.MODES[name], torch.get_num_threads(), draft)
    try:
        server.start()
        run, calls = llamacpp.runner(server, target.tokenizer, stops, args.chat)
    except BaseException:
        server.stop()
        raise
    return Method(name, run, own_forwards=calls, settings=server.settings(), close=server.stop)


def adapt_on(engine: Engine, train: list[dict], args: argparse.Namespace) -> dict:
    """Serve every training prompt with omnidraft as the app does (with --chat as a
    user message through the chat templates, like the evaluation): each finished
    turn is recorded, and the learner runs its round in the gap before the next
    prompt once a batch of new turns has gathered (the paper's schedule, every I
    prompts one pass, with the learner's replay of earlier turns), or once
    --learn-every turns have (1: as the app learns for a user who pauses after
    every reply)."""
    learn_every = args.learn_every or engine.learn_settings.batch_size
    serve_s = learn_s = 0.0
    steps_before = None
    last = None
    for i, row in enumerate(train):
        t0 = time.perf_counter()
        for _ in prompt_events(engine, row["prompt"], prompt_config(args, i), True, args.chat):
            pass
        t1 = time.perf_counter()
        if len(engine.buffer.new_samples()) >= learn_every or i == len(train) - 1:
            while (progress := engine.idle_step()) is not None and progress.state == "running":
                steps_before = progress.steps if steps_before is None else steps_before
                last = progress
                if progress.buffered == 0:
                    break
        serve_s, learn_s = serve_s + t1 - t0, learn_s + time.perf_counter() - t1
        loss = f", loss {last.loss:.3f}" if last and last.loss is not None else ""
        print(f"adapt {i + 1}/{len(train)}: served {t1 - t0:.1f} s, learned "
              f"{time.perf_counter() - t1:.1f} s{loss}", file=sys.stderr, flush=True)
    return {
        "train_prompts": len(train),
        "learn_every": learn_every,
        "turns_recorded": engine.buffer.total_added,  # only training turns: evaluation records none
        "learn_steps": last.steps if last else 0,
        "samples_trained": last.samples if last else 0,
        "serve_seconds": serve_s,
        "learn_seconds": learn_s,
        "final_loss": last.loss if last else None,
        "ngram_cache_entries": len(engine.bridge.cache),
        # What adaptive drafting measured per draft source while serving (tokens/s).
        "draft_sources": engine.draft_policy.summary(),
        # The rank the drafter streams the adapter at (AdapterStore.low_rank_state),
        # and the stop rule's online correction (logit bias) where serving left it.
        "adapter_rank": engine.drafter.adapter_rank,
        "calibration_bias": engine.draft_policy.calibration.bias,
    }
