"""The methods `omnidraft-bench` times, each a Runner: prompt text in, token ids out.

  target     this engine's plain decoding (Engine.complete)
  hf         transformers model.generate() alone
  uag        transformers assisted generation with the drafter as assistant_model
             (Universal Assisted Generation when the vocabularies differ)
  omnidraft  this engine's speculative decoding (Engine.complete(..., speculative=True))
  omnidraft-kN  the same, drafting exactly N drafter tokens per drafter step (no
             stop rule: neither the confidence nor the acceptance head cuts a
             draft short), the fixed draft lengths adaptive drafting must beat
  omnidraft-maxN  the engine's stop rules with at most N drafter tokens per step
  omnidraft-unpriced  the engine's drafting without priced stops (DraftPrices):
             the fixed confidence rule they replace
  omnidraft-drawn  under sampling, drafts drawn from the drafter's distribution
             (accepted with min(1, p/q')) instead of its most likely tokens (point
             masses accepted with the target's p(t)), as omnidraft drafted until Dec 6
  omnidraft-readN  the drafter reads at most N of the prompt's tokens: its first and
             the most recent (1 to 4096)
  omnidraft-head4, omnidraft-head8  the drafter's LM head in 4 bits (the default
             beside 4-bit layers) or int8, over the default head's token ids: what
             a drafted token costs against what it drafts (docs/drafter.md)
  omnidraft-vocabN  the drafter's 4-bit LM head over its first N token ids (256 to
             65536; the default 32,768, DraftSettings.head_tokens; BPE ids run
             roughly by frequency): fewer bytes a drafted token against the
             proposals above N it cannot make
  omnidraft-layersN  drafting with the drafter's first N layers only (then its final
             norm and LM head), untrained for it; refused while an adapter is loaded
  omnidraft-q4k  the drafter's 4-bit layers and head rounded onto Q4_K's grid (4.5
             bits a weight) instead of its file's Q4_1 (5): fewer bytes a drafted
             token against a coarser drafter; refused while an adapter is loaded
  omnidraft-untrained  omnidraft as a fresh install drafts for the target: a drafter
             of its own on the shipped weights, without the learned adapter,
             acceptance head, n-gram merges and drafting state; beside omnidraft
             on a --state-dir's learned state, what learning gave in one run
             (docs/learning.md)
  llamacpp   llama.cpp's own plain greedy decoding of the same GGUF file (bench/llamacpp.py)

Every method is timed with the same wall clock around one whole call, prompt text
in, token ids out; methods run interleaved prompt by prompt so machine drift hits
all alike. tokens_per_step is new tokens per target forward call (prompt forward
included), counted by a hook on the target's input embeddings: one definition for
the engine and for transformers, so the peers compare. Plain decoding gives 1.0.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from omnidraft.core.decoding.adaptive_drafting import DraftPolicy
from omnidraft.core.decoding.drafter import Drafter
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine
from omnidraft.core.engine_api import EngineAPI
from omnidraft.core.events import TurnFinished, TurnStats
from omnidraft.core.learning.acceptance_head import AcceptanceHead
from omnidraft.core.models.catalog import SMOLLM2_ID, ModelCatalog
from omnidraft.core.models.chat_format import encode_chat, stop_token_ids
from omnidraft.core.models.int4 import Q4_K
from omnidraft.core.models.lean_llama import DraftLinear, LeanLlama
from omnidraft.core.models.loader import LoadedModel, load, source_path

METHODS = ("target", "hf", "uag", "omnidraft", "llamacpp")
# "int4": bf16 with a GGUF's Q4_K layers in 4 bits and the rest int8 (the app's default,
# core/models/int4.py); "int8": every large linear layer int8 (core/models/quantize.py).
DTYPES = {"int4": torch.bfloat16, "int8": torch.bfloat16, "bf16": torch.bfloat16, "fp32": torch.float32}
# A neutral warm-up text: the engine may learn from what it decodes, and the
# warm-up must not hand it a benchmark prompt's continuation in advance.
WARMUP_PROMPT = "The quick brown fox"
WARMUP_TOKENS = 4


FIXED_LENGTH = re.compile(r"omnidraft-k([1-9]|1[0-6])")
CAPPED_LENGTH = re.compile(r"omnidraft-max([1-9]|1[0-6])")
UNPRICED = "omnidraft-unpriced"
DRAWN = "omnidraft-drawn"  # under sampling: drafts drawn from the drafter's distribution
HEAD_BITS = {"omnidraft-head4": 4, "omnidraft-head8": 8}
HEAD_ROWS = re.compile(r"omnidraft-vocab([1-9][0-9]{2,4})")  # 100 to 99999; 256 to 65536 taken
LAYERS = re.compile(r"omnidraft-layers([1-9][0-9]?)")  # 1 to 99
Q4K_DRAFTER = "omnidraft-q4k"
PROMPT_READ = re.compile(r"omnidraft-read([1-9][0-9]{0,3})")  # 1 to 4096
UNTRAINED = "omnidraft-untrained"


def fixed_length(name: str) -> int | None:
    """N for a method named omnidraft-kN (1 to 16), else None."""
    match = FIXED_LENGTH.fullmatch(name)
    return int(match.group(1)) if match else None


def draft_overrides(name: str) -> dict | None:
    """The engine's draft settings a drafting variant swaps in (None: not a variant)."""
    if (k := fixed_length(name)) is not None:
        return {"k": k, "min_confidence": 0.0, "gamma": None, "priced": False}
    if match := CAPPED_LENGTH.fullmatch(name):
        return {"k": int(match.group(1))}
    if (match := PROMPT_READ.fullmatch(name)) and int(match.group(1)) <= 4096:
        return {"prompt_tokens": int(match.group(1))}
    if name == DRAWN:
        return {"draw_drafts": True}
    return {"priced": False} if name == UNPRICED else None


def head_rows(name: str) -> int | None:
    """N for a method named omnidraft-vocabN (256 to 65536), else None."""
    match = HEAD_ROWS.fullmatch(name)
    return int(match.group(1)) if match and 256 <= int(match.group(1)) <= 65536 else None


def is_method(name: str) -> bool:
    return (name in METHODS or name in HEAD_BITS or name in (Q4K_DRAFTER, UNTRAINED) or head_rows(name) is not None
            or LAYERS.fullmatch(name) is not None or draft_overrides(name) is not None)


class BenchError(Exception):
    """A problem with the command line or the inputs; printed without a traceback."""


@dataclass
class Output:
    """One method's result on one prompt."""

    token_ids: list[int]
    seconds: float  # wall clock around the whole call
    forwards: int  # target forward calls, prompt forward included
    stats: TurnStats | None = None  # the engine's own accounting (engine methods only)


Runner = Callable[[str, GenerationConfig], tuple[list[int], TurnStats | None]]


@dataclass
class Method:
    name: str
    run: Runner
    forwards_reliable: bool = True
    outputs: list[Output] = field(default_factory=list)
    # A method that does not run the torch target counts its own forwards here.
    own_forwards: list[int] | None = None


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


def variant_runner(engine: Engine, overrides: dict, chat: bool = False) -> Runner:
    """omnidraft with some of the engine's draft settings swapped for the call
    (draft_overrides) and restored after."""
    speculative = engine_runner(engine, True, chat)

    def run(prompt: str, cfg: GenerationConfig) -> tuple[list[int], TurnStats | None]:
        with swapped(engine.draft_settings, **overrides):
            return speculative(prompt, cfg)

    return run


def head_runner(engine: Engine, bits: int, chat: bool = False, rows: int | None = None) -> Runner:
    """omnidraft with the drafter's LM head in `bits` (4 or 8) over its first
    `rows` token ids (None: as many as the engine's own head) for the call, its
    own head restored after."""
    speculative = engine_runner(engine, True, chat)
    head: list[DraftLinear] = []  # built on the first call, once the drafter is loaded

    def run(prompt: str, cfg: GenerationConfig) -> tuple[list[int], TurnStats | None]:
        net = engine.drafter.net
        if not head:
            weight = engine.drafter_model.model.get_output_embeddings().weight
            kept = rows or net.head.out_features  # head4 / head8: as many ids as the drafter's own head
            head.append(DraftLinear(weight[:kept].detach().to(net.dtype).contiguous(), None, True, bits == 4))
        with swapped(net, head=head[0]):
            return speculative(prompt, cfg)

    return run


def other_drafter_runner(engine: Engine, name: str, chat: bool = False, **net_args) -> Runner:
    """omnidraft drafting through another build of the drafter's net (LeanLlama's
    net_args, e.g. num_layers) for the call, its own net restored after."""
    speculative = engine_runner(engine, True, chat)
    other: list[LeanLlama] = []  # built on the first call, once the drafter is loaded

    def run(prompt: str, cfg: GenerationConfig) -> tuple[list[int], TurnStats | None]:
        drafter = engine.drafter
        if drafter.adapter_rank is not None:
            raise BenchError(f"{name} drafts without the target's adapter; run it before any learning")
        if not other:
            full = drafter.net
            other.append(LeanLlama(engine.drafter_model.model, max_len=full.max_len, int8=full.int8,
                                   int4=full.int4, head_rows=full.head.out_features, **net_args))
        drafter.forget_context()  # the drafter's context lives in its net's cache: empty it on each swap
        with swapped(drafter, net=other[0]):
            try:
                return speculative(prompt, cfg)
            finally:
                drafter.forget_context()

    return run


def untrained_runner(engine: Engine, chat: bool = False) -> Runner:
    """omnidraft without what the engine learned for its target: a drafter of its
    own on the shipped weights (no adapter) with a fresh acceptance head, no n-gram
    merges and a fresh drafting policy (own_policy), swapped in for the call. Its
    own drafter keeps its own cache, so like omnidraft it reads only what a prompt
    does not share with the previous one; swapping an adapter out of the engine's
    drafter and back would cost each call the adapter's merge and a whole prompt read."""
    speculative = engine_runner(engine, True, chat)
    own: list[Drafter] = []  # built on the first call, once the engine's drafter is loaded

    def run(prompt: str, cfg: GenerationConfig) -> tuple[list[int], TurnStats | None]:
        if not own:
            drafter = Drafter(engine.drafter_model, engine.draft_settings, max_len=engine.drafter.max_len)
            drafter.head = AcceptanceHead(engine.drafter_model.model.config.hidden_size)
            own.append(drafter)
        with swapped(engine, drafter=own[0]), swapped(engine.bridge.cache, entries=OrderedDict()):
            return speculative(prompt, cfg)

    return own_policy(engine, run, DraftPolicy())


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
    return Output(ids, seconds, calls[0] - before if calls else hooked[0], stats)


def prompt_config(args: argparse.Namespace, index: int) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed + index
    )


def warm_up(method: Method) -> None:
    """One short untimed generation: first-call overheads (allocations, lazy init) stay out.

    It is also where a method that cannot run here fails, before any timing.
    """
    try:
        method.run(WARMUP_PROMPT, GenerationConfig(max_new_tokens=WARMUP_TOKENS))
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise BenchError(f"method '{method.name}' cannot run: {type(exc).__name__}: {exc}") from exc


def run_interleaved(
    methods: list[Method], target_model, prompts: list[dict], args: argparse.Namespace
) -> None:
    """For each prompt, each method in turn, so drift of the machine hits all alike."""
    for i, row in enumerate(prompts):
        cfg = prompt_config(args, i)
        line = []
        for m in methods:
            out = timed(m, target_model, row["prompt"], cfg)
            m.outputs.append(out)
            line.append(f"{m.name} {len(out.token_ids)} tok {out.seconds:.2f} s")
        print(f"prompt {i + 1}/{len(prompts)}: " + ", ".join(line), file=sys.stderr, flush=True)


def build_methods(
    args: argparse.Namespace, engine: EngineAPI, catalog: ModelCatalog
) -> tuple[list[Method], str | None]:
    """Runners in the order asked, warmed up; uag last so a lazily loaded drafter exists."""
    made: dict[str, Method] = {}
    if "target" in args.methods:
        made["target"] = Method("target", engine_runner(engine, False, args.chat))
    if "hf" in args.methods:
        made["hf"] = Method("hf", hf_runner(engine.target, chat=args.chat))
    if "omnidraft" in args.methods:
        made["omnidraft"] = Method("omnidraft", engine_runner(engine, True, args.chat))
    for name in args.methods:
        run = None
        if (overrides := draft_overrides(name)) is not None:
            run = variant_runner(engine, overrides, args.chat)
        elif name in HEAD_BITS:
            run = head_runner(engine, HEAD_BITS[name], args.chat)
        elif (rows := head_rows(name)) is not None:
            run = head_runner(engine, 4, args.chat, rows)
        elif match := LAYERS.fullmatch(name):
            run = other_drafter_runner(engine, "omnidraft-layersN", args.chat, num_layers=int(match.group(1)))
        elif name == Q4K_DRAFTER:
            run = other_drafter_runner(engine, name, args.chat, layout=Q4_K)
        elif name == UNTRAINED:
            made[name] = Method(name, untrained_runner(engine, args.chat))
        if run is not None:
            made[name] = Method(name, own_policy(engine, run))
    drafting = [m for m in made.values() if m.name.startswith("omnidraft")]
    for m in made.values():
        warm_up(m)
    for m in drafting:
        m.forwards_reliable = not shares_embeddings(engine)
    # The drafter is named only when a method used it (the engine may load one anyway).
    drafter = engine.drafter_model.entry if engine.drafter_model is not None else None
    name = drafter.name if drafter and drafting else None
    if "llamacpp" in args.methods and (peer := llamacpp_method(engine, args)) is not None:
        made["llamacpp"] = peer
    if "uag" in args.methods:
        assistant = uag_drafter(engine, DTYPES[args.dtype], catalog, args.drafter)
        made["uag"] = Method("uag", hf_runner(engine.target, assistant, args.chat))
        warm_up(made["uag"])
        name = name or assistant.entry.name
    return [made[m] for m in args.methods if m in made], name


def llamacpp_method(engine: EngineAPI, args: argparse.Namespace) -> Method | None:
    """llama.cpp on the target's own GGUF file; None (the report says why) when the
    target is not a GGUF file. Missing llama.cpp is an error naming `make peers`."""
    from . import llamacpp

    target = engine.target
    gguf = source_path(target.entry)
    if gguf.suffix.lower() != ".gguf":
        return None
    if llamacpp.build_info() is None:
        raise BenchError(llamacpp.INSTALL_HINT)
    stops = stop_token_ids(target.tokenizer, target.model)
    run, calls = llamacpp.runner(gguf, target.tokenizer, stops, args.chat, torch.get_num_threads())
    method = Method("llamacpp", run, own_forwards=calls)
    warm_up(method)
    return method


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
