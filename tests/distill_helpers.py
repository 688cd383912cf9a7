"""Samples and model pairs shared by the distillation, adapter and learner tests."""

from __future__ import annotations

from functools import cache

import torch
from omnidraft.core.decoding.vocab_bridge import VocabBridge
from omnidraft.core.learning.replay_buffer import Sample

from tests.tiny import tiny_llama

PROMPT = "Question: what is the capital of France?\nAnswer:"
# Words both tokenizers spell differently give n-gram segments; common words map directly.
REPLIES = [
    " The capital of France is Paris, a flakey unbelievably photogenic city.",
    " Paris. It has been the capital for centuries, despite counterrevolutionaries.",
    " The answer is Paris; its biggest landmark is the Eiffel Tower.",
    " Paris is the capital, and Lyon is another large city in France.",
]


def make_sample(drafter_tok, target_tok, prompt: str, reply: str, same_ids: bool = False) -> Sample:
    t_prompt = target_tok(prompt)["input_ids"]
    t_reply = target_tok(reply, add_special_tokens=False)["input_ids"]
    if same_ids:  # same vocabulary: the engine gives the drafter the target's ids
        d_prompt, d_reply = t_prompt, t_reply
    else:
        d_prompt = drafter_tok(prompt)["input_ids"]
        d_reply = drafter_tok(reply, add_special_tokens=False)["input_ids"]
    return Sample(
        target_ids=t_prompt + t_reply, target_prompt_len=len(t_prompt),
        drafter_ids=d_prompt + d_reply, drafter_prompt_len=len(d_prompt),
        proposed=10, accepted=6,
    )


@cache
def cross_bridge(drafter_tok, target_tok) -> VocabBridge:
    """Building the SmolLM2 -> Gemma bridge reads 311k token spellings: once per session."""
    return VocabBridge(drafter_tok, target_tok)


def learnable_drafter(vocab_size: int, seed: int = 5):
    """A tiny Llama whose logits can move: a default tiny model's tied embeddings
    (std 0.02) keep every logit within about ±1, which no LoRA on the projections
    can widen, so its distribution stays near uniform whatever it learns."""
    model = tiny_llama(vocab_size, seed=seed)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(10.0)
    return model
