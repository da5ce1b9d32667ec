"""Speculative decoding (投机解码) without a second model: prompt-lookup drafting.

A decode step reads every weight to produce one token, and on most machines
it is limited by memory bandwidth, not arithmetic: checking 6 tokens in one
forward pass costs little more than producing 1. Speculative decoding uses
that. Something cheap guesses the next few tokens (the draft); one forward
pass of the real model over [last token, draft...] gives the model's own
choice after each of them; the guesses are kept up to the first one the
model disagrees with, and the model's token at that point is kept too. So a
round yields between 1 and len(draft) + 1 tokens for one forward pass.

The guesser here is prompt lookup (n-gram drafting, as in transformers'
`prompt_lookup_num_tokens` and vLLM's "ngram" speculator): find the most
recent earlier place where the last n tokens occurred (in the prompt or the
text so far) and propose the tokens that followed. It costs no model at
all, and it works whenever the answer copies from the context: quoting,
summarising, editing code, filling a form, or a model repeating itself.

Rejected draft tokens had their K and V written into the KV cache by the
verifying pass; `cache.truncate(length)` forgets them, so the next round
writes over them.

Greedy only: each kept token is the argmax the model gives at that
position, so the output is plain greedy decoding's (tests check it token
for token against labkit.generate). Floating-point sums over a few tokens
at once are not bit-identical to one token at a time, so on a near-tie
(two logits equal to ~1e-6, or ~1e-2 in bf16) the two could differ; the
comparison is made in fp32. Left out: sampling with speculative decoding
(that needs the rejection-sampling rule of Leviathan et al. / Chen et al.),
draft models, tree drafts (Medusa, EAGLE).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .generation import Decoder
from .sampling import SamplingParams


@dataclass
class Round:
    """One forward pass: the draft it checked and what it kept."""

    draft: list[int]          # tokens proposed by prompt lookup (may be empty)
    accepted: int             # how many of them the model agreed with, from the start
    token_ids: list[int]      # tokens this pass added: the accepted drafts + the model's own next token
    seconds: float
    phase: str = "verify"     # "prefill" for the first pass

    @property
    def rejected(self) -> list[int]:
        return self.draft[self.accepted:]


@dataclass
class SpeculativeGeneration:
    prompt: str
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    rounds: list[Round] = field(default_factory=list)
    finish_reason: str = ""     # "eos" or "length"
    seconds: float = 0.0        # wall time of the whole loop, prefill included

    @property
    def forward_passes(self) -> int:
        return len(self.rounds)

    @property
    def drafted(self) -> int:
        return sum(len(r.draft) for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / drafted tokens (nan when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def tokens_per_pass(self) -> float:
        """Tokens generated per forward pass (1.0 for plain decoding)."""
        return len(self.token_ids) / self.forward_passes if self.rounds else float("nan")

    def __repr__(self) -> str:
        return (f"SpeculativeGeneration({self.text!r}, {len(self.token_ids)} tokens in "
                f"{self.forward_passes} forward passes, accepted {self.accepted}/{self.drafted} drafted, "
                f"{self.seconds:.2f} s)")


def find_draft(ids: list[int], num_draft: int = 5, ngram_max: int = 3, ngram_min: int = 1) -> list[int]:
    """Prompt lookup: the tokens that followed the most recent earlier occurrence
    of the last n tokens of `ids`, trying n = ngram_max down to ngram_min.
    Returns up to num_draft tokens ([] when no n-gram recurs)."""
    if num_draft < 1:
        return []
    for n in range(ngram_max, ngram_min - 1, -1):
        if len(ids) <= n:
            continue
        tail = ids[-n:]
        # Latest match first, and only matches with at least one token after them.
        for start in range(len(ids) - n - 1, -1, -1):
            if ids[start:start + n] == tail:
                return list(ids[start + n:start + n + num_draft])
    return []


@torch.inference_mode()
def speculative_generate(model, prompt, max_new_tokens: int = 32, *, num_draft: int = 5,
                         ngram_max: int = 3, ngram_min: int = 1, chat: bool = False,
                         system: str | None = None, stop_at_eos: bool = True) -> SpeculativeGeneration:
    """Greedy generation with prompt-lookup drafts verified by the model.

    prompt: text, a conversation, an Encoding or token ids (as labkit.generate).
    num_draft: the most tokens drafted per round; ngram_max / ngram_min: the
    n-gram lengths matched, longest first.
    The token ids equal labkit.generate(model, prompt, max_new_tokens, method="greedy")'s.

    The bookkeeping is labkit.generation.Decoder's: its first step() is the
    prefill, and every token a verifying pass keeps goes through add_token,
    which also decides when the generation is over (EOS or the length limit).
    """
    if not 1 <= ngram_min <= ngram_max:
        raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
    decoder = Decoder(model, prompt, max_new_tokens, SamplingParams("greedy"), chat=chat, system=system,
                      stop_at_eos=stop_at_eos)
    gen = SpeculativeGeneration(decoder.generation.prompt, decoder.generation.prompt_ids)
    if max_new_tokens == 0:
        return gen
    start = time.perf_counter()
    first = decoder.step()                                       # prefill: the model's first token
    gen.rounds.append(Round([], 0, [first.token_id], first.seconds, "prefill"))
    cache = decoder.cache
    while not decoder.finished:
        t0 = time.perf_counter()
        # Never draft past the limit: the pass itself adds one more token.
        room = max_new_tokens - len(decoder.token_ids) - 1
        draft = find_draft(decoder.ids, min(num_draft, room), ngram_max, ngram_min) if room > 0 else []
        kept = cache.length                                      # positions before the newest token
        tokens = torch.tensor([decoder.ids[-1]] + draft, device=model.device)
        logits = model.forward(tokens, cache=cache)              # (1 + len(draft), vocab): verify all at once
        choice = logits.argmax(dim=-1).tolist()                  # the model's token after each input token
        accepted = 0
        while accepted < len(draft) and draft[accepted] == choice[accepted]:
            accepted += 1
        cache.truncate(kept + 1 + accepted)                      # forget the K/V of rejected drafts
        seconds = time.perf_counter() - t0
        # The pass's time goes to its first token: the others arrive with it.
        new_tokens = []
        for i, token in enumerate(draft[:accepted] + [choice[accepted]]):
            decoder.add_token(token, logits[i], seconds if i == 0 else 0.0)
            new_tokens.append(token)
            if decoder.finished:                                 # EOS or the limit, mid-round
                break
        gen.rounds.append(Round(draft, min(accepted, len(new_tokens)), new_tokens, seconds))
    gen.seconds = time.perf_counter() - start
    gen.token_ids, gen.text, gen.finish_reason = decoder.token_ids, decoder.text, decoder.finish_reason
    return gen
