"""Speculative decoding (投机解码): prompt-lookup drafts, and a draft model with
the rejection-sampling rule.

A decode step reads every weight to produce one token, and on most machines
it is limited by memory bandwidth, not arithmetic: on a GPU, checking 6
tokens in one forward pass costs little more than producing 1 (on a small
CPU, about twice as much: notebook 09 measures it). Speculative decoding uses
that. Something cheap guesses the next few tokens (the draft); one forward
pass of the real (target) model over [last token, draft...] gives the
target's own distribution after each of them; the guesses are kept up to the
first one the target rejects, and one token of the target's is added. So a
round yields between 1 and len(draft) + 1 tokens for one target pass.

Two drafters, two verification rules:

- `speculative_generate`: prompt lookup (n-gram drafting, as in
  transformers' `prompt_lookup_num_tokens` and vLLM's "ngram" speculator)
  finds the most recent earlier place where the last n tokens occurred (in
  the prompt or the text so far) and proposes the tokens that followed. No
  model at all; it works whenever the answer copies from the context. Greedy
  verification: a draft token is kept when it is the target's argmax, so the
  output is plain greedy decoding's (tests check it token for token).
  Floating-point sums over a few tokens at once are not bit-identical to one
  token at a time, so on a near-tie (two logits equal to ~1e-6, or ~1e-2 in
  bf16) the two could differ; the comparison is made in fp32.

- `speculative_sample`: a draft *model* q (any labkit Model with the same
  vocabulary: a quantized copy, or the target's first layers, `early_exit`)
  samples gamma tokens; the target's pass gives p at each of them; draft
  token x is accepted with probability min(1, p(x) / q(x)); at the first
  rejection the token is drawn from the residual norm(max(0, p - q)); when
  all gamma are accepted a bonus token is drawn from p after the last one.
  That rule (Leviathan et al. 2023, "Fast Inference from Transformers via
  Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language
  Model Decoding with Speculative Sampling") makes every output token
  distributed exactly as the target's own sampling would give it, whatever
  the draft: P(token = x) = min(p(x), q(x)) + max(0, p(x) - q(x)) = p(x).
  tests/test_speculative.py checks it with a chi-square test. With greedy
  settings p and q are one-hot and the rule becomes greedy verification.

Expected gain (Leviathan et al., sec. 3): with per-token acceptance
probability alpha = E[sum_x min(p(x), q(x))] and gamma draft tokens, a
target pass yields (1 - alpha^(gamma+1)) / (1 - alpha) tokens on average;
counting the draft's cost c (one draft step / one target step), the
wall-clock speed-up is that divided by (gamma * c + 1).

Rejected draft tokens had their K and V written into the KV caches;
`cache.truncate(length)` forgets them, so the next round writes over them.

Left out: tree drafts (Medusa, EAGLE, SpecInfer), batches, and adapting
gamma to the acceptance rate as it goes.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field

import torch

from . import timing
from .generation import Decoder, Generation
from .model import Model
from .sampling import SamplingParams, distribution, make_generator


@dataclass
class Round:
    """One forward pass of the target: the draft it checked and what it kept."""

    draft: list[int]          # tokens proposed (may be empty)
    accepted: int             # how many of them were kept, from the start
    token_ids: list[int]      # tokens this pass added: the accepted drafts + the target's own token
    seconds: float            # the whole round: drafting and the target's pass
    phase: str = "verify"     # "prefill" for the first pass
    draft_seconds: float = 0.0            # the drafting part of `seconds` (0 for prompt lookup)
    # Draft model only: sum_x min(p(x), q(x)) at each draft position the target examined,
    # the probability that the rule accepts there (its mean estimates alpha without the
    # noise of the accept/reject draws).
    accept_probs: list[float] = field(default_factory=list)

    @property
    def rejected(self) -> list[int]:
        return self.draft[self.accepted:]

    @property
    def examined(self) -> int:
        """Draft tokens the target judged: those accepted, and the first rejected one
        (the tokens after a rejection are thrown away unjudged)."""
        return self.accepted + (self.accepted < len(self.draft))


@dataclass
class SpeculativeGeneration:
    prompt: str
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    rounds: list[Round] = field(default_factory=list)
    finish_reason: str = ""     # "eos" or "length"
    seconds: float = 0.0        # end to end: the request (tokenization included) to the last token
    generation: Generation | None = None   # the Decoder's record: Steps with at_s, TTFT, ITL

    @property
    def e2e_s(self) -> float:
        """End-to-end latency, as Generation.e2e_s: the request to the last token."""
        return self.seconds

    @property
    def forward_passes(self) -> int:
        """Forward passes of the target (the draft model's are not counted)."""
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
    def per_token_acceptance(self) -> float:
        """Accepted / examined draft tokens: the measured per-token acceptance
        (Leviathan et al.'s alpha), not diluted by the draft tokens after a
        rejection, which are never judged (nan when nothing was examined)."""
        examined = sum(r.examined for r in self.rounds)
        return self.accepted / examined if examined else float("nan")

    @property
    def tokens_per_pass(self) -> float:
        """Tokens generated per target forward pass (1.0 for plain decoding)."""
        return len(self.token_ids) / self.forward_passes if self.rounds else float("nan")

    def __repr__(self) -> str:
        return (f"SpeculativeGeneration({self.text!r}, {len(self.token_ids)} tokens in "
                f"{self.forward_passes} forward passes, accepted {self.accepted}/{self.drafted} drafted, "
                f"{self.seconds:.2f} s)")


# ----------------------------------------------------------------------------
# Prompt lookup, greedy verification
# ----------------------------------------------------------------------------

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
    start = time.perf_counter()                                  # the request
    decoder = Decoder(model, prompt, max_new_tokens, SamplingParams("greedy"), chat=chat, system=system,
                      stop_at_eos=stop_at_eos)
    gen = SpeculativeGeneration(decoder.generation.prompt, decoder.generation.prompt_ids,
                                generation=decoder.generation)
    if max_new_tokens == 0:
        return gen
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
        timing.sync(model.device)                                # the pass is finished, not only queued
        seconds = time.perf_counter() - t0
        # The pass's time goes to its first token: the others arrive with it.
        new_tokens = _keep(decoder, draft[:accepted] + [choice[accepted]], logits, seconds)
        gen.rounds.append(Round(draft, min(accepted, len(new_tokens)), new_tokens, seconds))
    timing.sync(model.device)
    gen.seconds = time.perf_counter() - start
    gen.token_ids, gen.text, gen.finish_reason = decoder.token_ids, decoder.text, decoder.finish_reason
    return gen


def _keep(decoder: Decoder, tokens: list[int], logits: torch.Tensor, seconds: float) -> list[int]:
    """Hand a round's tokens to the decoder, stopping early at EOS or the limit.
    logits (len(tokens) or more, vocab): row i is what tokens[i] was chosen from."""
    kept = []
    for i, token in enumerate(tokens):
        decoder.add_token(token, logits[i], seconds if i == 0 else 0.0)
        kept.append(token)
        if decoder.finished:
            break
    return kept


# ----------------------------------------------------------------------------
# A draft model, the rejection-sampling rule
# ----------------------------------------------------------------------------

def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what the target wants more of than the draft gave.
    When p == q (nothing to correct; a rejection then has probability 0) it is p."""
    r = (p - q).clamp(min=0)
    total = r.sum()
    return r / total if total > 0 else p


def verify(p: torch.Tensor, q: torch.Tensor, draft: list[int],
           generator: torch.Generator | None = None) -> tuple[int, int]:
    """The rejection-sampling rule for one round.

    p: (len(draft) + 1, vocab), the target's distribution at each draft position
       and after the last draft token; q: (len(draft), vocab), the draft model's,
       from which draft[i] was sampled.
    Returns (accepted, token): how many draft tokens are kept, from the start,
    and the target's token after them: drawn from the residual at the first
    rejection, or from p after the last draft token (the bonus) when all are kept.
    """
    if p.shape[0] != len(draft) + 1 or q.shape[0] != len(draft):
        raise ValueError(f"need p with len(draft) + 1 = {len(draft) + 1} rows and q with {len(draft)}, "
                         f"got {p.shape[0]} and {q.shape[0]}")
    for i, x in enumerate(draft):
        u = torch.rand((), generator=generator, device=p.device)
        if u * q[i, x] < p[i, x]:                 # u < p(x) / q(x), without dividing by a tiny q
            continue                              # accepted
        return i, int(torch.multinomial(residual(p[i], q[i]), 1, generator=generator))
    return len(draft), int(torch.multinomial(p[-1], 1, generator=generator))


def acceptance_probability(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """sum_x min(p(x), q(x)) per row: the chance that the rule accepts a token
    drawn from q (1 - the total variation distance between p and q). Its mean
    over positions is Leviathan et al.'s alpha."""
    return torch.minimum(p, q).sum(-1)


def expected_tokens_per_pass(alpha: float, num_draft: int) -> float:
    """(1 - alpha^(gamma+1)) / (1 - alpha): the mean tokens a target pass yields
    when each draft token is accepted with probability alpha (gamma + 1 at alpha = 1)."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    if num_draft < 0:
        raise ValueError(f"num_draft must be >= 0, got {num_draft!r}")
    if alpha == 1:
        return num_draft + 1.0
    return (1 - alpha ** (num_draft + 1)) / (1 - alpha)


def expected_speedup(alpha: float, num_draft: int, cost_ratio: float) -> float:
    """Leviathan et al.'s expected wall-clock speed-up over plain decoding:
    tokens per pass / (gamma * c + 1), with c = one draft step's time / one
    target step's (a round costs gamma draft steps and one target pass, which
    costs about one decode step while decode is memory-bound)."""
    if cost_ratio < 0:
        raise ValueError(f"cost_ratio must be >= 0, got {cost_ratio!r}")
    return expected_tokens_per_pass(alpha, num_draft) / (num_draft * cost_ratio + 1)


class EarlyExitModel(Model):
    """A Model that runs only its first blocks (made by `early_exit`)."""

    @property
    def weight_nbytes(self) -> int:
        """Bytes a decode step reads: the blocks it runs, the final norm and the LM head."""
        modules = (*self.blocks, self.final_norm, self.hf.lm_head)
        tensors = {id(t): t for m in modules for t in (*m.parameters(), *m.buffers())}
        return sum(t.numel() * t.element_size() for t in tensors.values())


def early_exit(model, n_layers: int):
    """A draft that shares the target's weights: its first n_layers blocks, then
    its own final norm and LM head ("self-speculative" / early-exit drafting, as
    in LayerSkip, Elhoushi et al. 2024, which trains the model for it). No
    weights are copied; the draft has its own (smaller) KV cache."""
    if not 1 <= n_layers <= model.config.n_layers:
        raise ValueError(f"n_layers must be in [1, {model.config.n_layers}], got {n_layers!r}")
    if type(model) is not Model:
        raise ValueError(f"early_exit needs a plain labkit Model, got {type(model).__name__}")
    draft = copy.copy(model)                                  # shares hf, tokenizer and every weight
    draft.__class__ = EarlyExitModel
    draft.blocks = model.blocks[:n_layers]
    draft.config = dataclasses.replace(model.config, n_layers=n_layers)
    draft.name = f"{model.name} (first {n_layers} of {model.config.n_layers} layers)"
    return draft


@torch.inference_mode()
def speculative_sample(target, draft, prompt, max_new_tokens: int = 32, *, num_draft: int = 4,
                       params: SamplingParams | None = None, seed: int | None = None, chat: bool = False,
                       system: str | None = None, stop_at_eos: bool = True) -> SpeculativeGeneration:
    """Speculative sampling: `draft` proposes, `target` verifies with the
    rejection-sampling rule, so every token is distributed as the target's own.

    target, draft: labkit Models with the same vocabulary.
    num_draft: gamma, the tokens drafted per round (0: plain decoding by the target).
    params: the sampling settings (temperature, top-k, ...), applied to both
      models' logits: p and q are the distributions each would sample from.
      Default: SamplingParams("temperature") at temperature 1.
    seed: one random stream for the draft's samples and the rule's draws.

    A round: the draft samples gamma tokens one at a time (gamma small forward
    passes), the target runs once over the tokens it has not cached plus the
    draft, `verify` keeps a prefix and adds the target's token. The first round
    is the target's prefill (the prompt and the first draft in one pass).
    """
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(f"draft's vocabulary ({draft.config.vocab_size}) must be the target's "
                         f"({target.config.vocab_size})")
    if not isinstance(num_draft, int) or num_draft < 0:
        raise ValueError(f"num_draft must be an integer >= 0, got {num_draft!r}")
    params = params or SamplingParams("temperature")
    if seed is not None:
        params = dataclasses.replace(params, seed=seed)
    start = time.perf_counter()                                  # the request
    decoder = Decoder(target, prompt, max_new_tokens, params, chat=chat, system=system, stop_at_eos=stop_at_eos)
    gen = SpeculativeGeneration(decoder.generation.prompt, decoder.generation.prompt_ids,
                                generation=decoder.generation)
    if max_new_tokens == 0:
        return gen
    device = target.device
    generator = make_generator(params.seed, device)
    t_cache, d_cache = decoder.cache, draft.new_cache(decoder.cache.max_len)

    def dist(logits, ids):
        return distribution(logits, params=params, previous_ids=ids).to(device)

    while not decoder.finished:
        t0 = time.perf_counter()
        ids = decoder.ids                                        # prompt + tokens so far
        # Never draft past the limit: the round adds one token of the target's too.
        gamma = min(num_draft, max_new_tokens - len(decoder.token_ids) - 1)
        drafted, q_rows = [], []
        for _ in range(gamma):
            context = ids + drafted
            logits = draft.forward(torch.tensor(context[d_cache.length:], device=draft.device), cache=d_cache,
                                   last_only=True)[-1]           # (vocab,): after the newest token
            q = dist(logits, context)
            q_rows.append(q)
            drafted.append(int(torch.multinomial(q, 1, generator=generator)))
        timing.sync(draft.device)
        draft_seconds = time.perf_counter() - t0
        # One target pass over what it has not cached (the whole prompt the first
        # time, then the newest token or two) and the draft: p at every draft position.
        fresh = ids[t_cache.length:] + drafted
        logits = target.forward(torch.tensor(fresh, device=device), cache=t_cache)[-(gamma + 1):]
        p_rows = torch.stack([dist(logits[i], ids + drafted[:i]) for i in range(gamma + 1)])
        q_stack = torch.stack(q_rows) if q_rows else p_rows[:0]
        accepted, token = verify(p_rows, q_stack, drafted, generator)
        examined = accepted + (accepted < gamma)
        accept_probs = acceptance_probability(p_rows[:examined], q_stack[:examined]).tolist()
        # Keep the K/V of the context and the accepted drafts; the new token is
        # fed (and cached) in the next round.
        t_cache.truncate(len(ids) + accepted)
        d_cache.truncate(min(d_cache.length, len(ids) + accepted))
        timing.sync(device)
        seconds = time.perf_counter() - t0
        new_tokens = _keep(decoder, drafted[:accepted] + [token], logits, seconds)
        gen.rounds.append(Round(drafted, min(accepted, len(new_tokens)), new_tokens, seconds,
                                "prefill" if not gen.rounds else "verify", draft_seconds, accept_probs))
    gen.seconds = time.perf_counter() - start
    gen.token_ids, gen.text, gen.finish_reason = decoder.token_ids, decoder.text, decoder.finish_reason
    return gen
