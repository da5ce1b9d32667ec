"""The autoregressive loop: prefill, then decode one token at a time.

    prefill:           the whole prompt in one forward pass; fills the KV cache;
                       its latency is the prefill time (the largest part of TTFT).
    decode_one_token:  one new token against the cache; reads every weight and
                       the whole cache; its latency is one inter-token gap.
    recompute:         the "without KV cache" baseline: the whole sequence
                       again at every step. The same greedy tokens, slower.

`Decoder` is the loop, one step at a time: its first `step()` is prefill,
every later one a decode step (or a recompute, with `use_cache=False`); each
samples a token (`SamplingParams`), records a `Step` (token, probability,
latency, cache size, attention row when recording) and checks whether the
generation is over (EOS, a stop string, the length limit). `generate` runs a
Decoder to the end; labkit.views.LiveGeneration and the dashboard step one
from the page; speculative decoding feeds it the tokens its verifying passes
keep. So every Step and every finish reason comes from one place.

The clocks (one definition each, the usual ones in serving benchmarks):

    TTFT   time to first token, from the request: generate() (or Decoder) is
           called -> the first token exists. It includes tokenization (when the
           prompt is text), the cache allocation, the prefill pass and sampling.
           A single request has no queue; labkit.batching adds the queueing.
    prefill time   the prefill step alone (Step.seconds of step 0).
    e2e    end-to-end latency: the request -> the last token.
    TPOT   time per output token, the mean: (e2e - TTFT) / (N - 1).
    ITL    inter-token latencies: the N - 1 gaps between consecutive tokens;
           their mean is TPOT, their percentiles show the jitter.

Streaming: a Step's `text` is the text its token completes; it never ends in
half a UTF-8 character (Chinese text from a byte-level vocabulary often needs
two or three tokens per character), so a piece can be "".

Beam search (`method="beam"`) keeps `num_beams` sequences as rows of one
batched cache and reorders the cache as beams are kept or dropped: a
different algorithm, so it has its own loop over the same prefill and
decode_one_token.

Left out: batches of prompts (see labkit.batching), speculative decoding
(labkit.speculative, which feeds a Decoder), logit processors beyond those
of labkit.sampling.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import timing
from .encoding import Encoding, encode
from .kv_cache import KVCache
from .sampling import SamplingParams, make_generator, sample, token_probability
from .trace import Trace


@dataclass
class Step:
    index: int             # 0 is the token that prefill produced
    token_id: int
    text: str              # the text this step added to the output ("" while a character is incomplete)
    prob: float            # the model's probability of the token (softmax at temperature 1)
    seconds: float         # this step's own work: the prefill time for step 0, a decode step after
    cache_len: int         # positions in the KV cache after this step (0 without a cache)
    cache_nbytes: int      # bytes of K and V held after this step
    phase: str             # "prefill" or "decode"
    attention: torch.Tensor | None = None   # (layers, heads, keys): this token's query row, when recorded
    at_s: float = float("nan")  # seconds from the request to this token's emission


@dataclass
class Generation:
    prompt: str
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    steps: list[Step] = field(default_factory=list)
    finish_reason: str = ""          # "eos", "length" or "stop"
    cache: KVCache | None = None
    prefill_trace: Trace | None = None   # the prefill's Trace when record=True

    tokenize_s: float = 0.0              # the part of TTFT spent turning text into ids

    @property
    def ttft_s(self) -> float:
        """Time to first token, from the request (tokenization and prefill included)."""
        return self.steps[0].at_s if self.steps else float("nan")

    @property
    def prefill_s(self) -> float:
        """The prefill step alone: one forward pass over the prompt and the first sample."""
        return self.steps[0].seconds if self.steps else float("nan")

    @property
    def e2e_s(self) -> float:
        """End-to-end latency: the request to the last token."""
        return self.steps[-1].at_s if self.steps else float("nan")

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive tokens (N - 1 of them)."""
        return [b.at_s - a.at_s for a, b in zip(self.steps, self.steps[1:])]

    @property
    def tpot_s(self) -> float:
        """Time per output token, the mean: (e2e - TTFT) / (N - 1). nan below two tokens."""
        n = len(self.steps)
        return (self.e2e_s - self.ttft_s) / (n - 1) if n > 1 else float("nan")

    @property
    def tpot_median_s(self) -> float:
        """The median inter-token gap: a noise-robust companion to TPOT (one slow
        step on a busy machine moves the mean, not the median)."""
        return timing.median(self.itl_s)

    def itl_percentile(self, p: float) -> float:
        """The p-th percentile (0-100) of the inter-token latencies (nearest rank)."""
        return timing.percentile(self.itl_s, p)

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: 1 / TPOT."""
        return 1.0 / self.tpot_s if self.tpot_s == self.tpot_s and self.tpot_s > 0 else float("nan")

    def __repr__(self) -> str:
        return (f"Generation({self.text!r}, {len(self.token_ids)} tokens, finish={self.finish_reason!r}, "
                f"TTFT {self.ttft_s * 1e3:.1f} ms, TPOT {self.tpot_s * 1e3:.1f} ms)")


# ----------------------------------------------------------------------------
# The two phases, and the baseline without a cache
# ----------------------------------------------------------------------------

def prefill(model, ids: torch.Tensor, cache: KVCache, trace: Trace | None = None) -> torch.Tensor:
    """The whole prompt in one pass: writes its K and V into the cache and
    returns the logits of its last position, (vocab,) (or (B, vocab) for ids (B, T))."""
    logits = model.forward(ids, cache=cache, trace=trace, last_only=True)   # (1, vocab) or (B, 1, vocab)
    return logits[..., -1, :]


def decode_one_token(model, token: torch.Tensor, cache: KVCache, trace: Trace | None = None) -> torch.Tensor:
    """One decode step: the newest token, shape (1,) (or (B, 1)), attends over
    the cache and adds its own K and V to it. Returns its logits, (vocab,) (or (B, vocab))."""
    logits = model.forward(token, cache=cache, trace=trace)              # (1, vocab) or (B, 1, vocab)
    return logits[..., -1, :]


def recompute(model, seq: torch.Tensor, trace: Trace | None = None) -> torch.Tensor:
    """The no-cache baseline: run the whole sequence (prompt + every token so
    far) again and return the logits of its last position, (vocab,). Each
    step costs as much as a prefill of the sequence so far."""
    logits = model.forward(seq, trace=trace, last_only=True)             # (1, vocab)
    return logits[-1]


# ----------------------------------------------------------------------------
# Prompts, ends and streaming
# ----------------------------------------------------------------------------

def read_prompt(model, prompt, chat: bool = False, system: str | None = None) -> tuple[str, torch.Tensor]:
    """(text, ids (T,)) of a prompt given as text, a conversation (list of
    {"role", "content"}), an Encoding, or token ids."""
    if isinstance(prompt, Encoding):
        return prompt.text, prompt.ids
    if isinstance(prompt, (str, list)) and not (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
        enc = encode(model, prompt, chat=chat, system=system)
        return enc.text, enc.ids
    ids = torch.as_tensor(prompt, dtype=torch.long).flatten()
    if ids.numel() == 0:
        raise ValueError("prompt is empty; give at least one token")
    return model.tokenizer.decode(ids) if model.tokenizer else "", ids


def check_length(model, n_prompt: int, max_new_tokens: int) -> None:
    """Raise a ValueError unless the prompt and max_new_tokens fit the model's context."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    limit = model.config.max_len
    if n_prompt > limit:
        raise ValueError(f"prompt has {n_prompt} tokens, more than the model's context of {limit}")
    if n_prompt + max_new_tokens > limit:
        raise ValueError(f"max_new_tokens must be <= {limit - n_prompt} for this {n_prompt}-token "
                         f"prompt (the model's context is {limit}), got {max_new_tokens}")


def eos_ids(model) -> set[int]:
    """The tokens that end a generation: the tokenizer's and the generation config's EOS."""
    ids = set()
    for source in (getattr(model.tokenizer, "eos_token_id", None),
                   getattr(getattr(model.hf, "generation_config", None), "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)
    return ids


class Streamer:
    """Turns token ids into text pieces that never split a UTF-8 character."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.emitted = tokenizer, [], ""

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""          # the last character is still incomplete: wait for its next byte
        piece, self.emitted = text[len(self.emitted):], text
        return piece

    def flush(self) -> str:
        """Whatever is left, incomplete character included (the generation is over)."""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        piece, self.emitted = text[len(self.emitted):], text
        return piece


def cut_at_stop(text: str, stops: list[str]) -> str:
    """text up to the earliest stop string in it."""
    cuts = [text.index(s) for s in stops if s in text]
    return text[:min(cuts)] if cuts else text


def newest_attention_row(trace: Trace) -> torch.Tensor:
    """The newest query's attention over all keys, per layer: (layers, heads, keys)."""
    return torch.stack([a[:, -1, :] for a in trace.attentions]).float().cpu()


# ----------------------------------------------------------------------------
# The loop, one step at a time
# ----------------------------------------------------------------------------

class Decoder:
    """Generation as a stepper: each `step()` makes one token.

    The clock starts when the Decoder is made (the request); the first step
    is prefill (its token ends the TTFT); every later one feeds the newest
    token to decode_one_token (one inter-token gap), or, with
    use_cache=False, recomputes the whole sequence. `params` may be replaced
    between steps (a live view's sliders); it applies from the next step on.

    prompt: text, a conversation, an Encoding or token ids (as generate).
    record: each Step keeps its token's attention row (the by-hand path).
    stop / stop_at_eos: end at a stop string (the text is cut before it) / at EOS.
    kv_dtype: None (the model's dtype) or "int8" (labkit.kv_quant).
    """

    def __init__(self, model, prompt, max_new_tokens: int = 32, params: SamplingParams | None = None, *,
                 use_cache: bool = True, record: bool = False, stop: list[str] | str | None = None,
                 stop_at_eos: bool = True, chat: bool = False, system: str | None = None,
                 kv_dtype: str | None = None):
        self.requested_at = time.perf_counter()    # the request: TTFT and every Step.at_s count from here
        self.model, self.max_new_tokens, self.record = model, max_new_tokens, record
        self.params = params or SamplingParams()
        text, ids = read_prompt(model, prompt, chat, system)
        tokenize_s = time.perf_counter() - self.requested_at
        check_length(model, len(ids), max_new_tokens)
        self.prompt_ids = ids.to(model.device)                  # (T,)
        self.ids = ids.tolist()            # prompt + tokens so far (repetition penalty, recompute, drafts)
        self.stops = [stop] if isinstance(stop, str) else list(stop or [])
        self.eos = eos_ids(model) if stop_at_eos else set()
        self.generator = make_generator(self.params.seed, model.device)
        # Room for the prompt and every new token; none when no token is asked for.
        self.cache = (model.new_cache(max_len=len(ids) + max_new_tokens, kv_dtype=kv_dtype)
                      if use_cache and max_new_tokens else None)
        self.generation = Generation(text, ids.tolist(), cache=self.cache, tokenize_s=tokenize_s)
        self.last_logits: torch.Tensor | None = None   # (vocab,): the logits the last token came from
        self.last_probs: torch.Tensor | None = None    # (vocab,): the distribution it was drawn from
        self._streamer = Streamer(model.tokenizer)

    @property
    def steps(self) -> list[Step]:
        return self.generation.steps

    @property
    def token_ids(self) -> list[int]:
        return self.generation.token_ids

    @property
    def text(self) -> str:
        return self.generation.text

    @property
    def finish_reason(self) -> str:
        return self.generation.finish_reason

    @property
    def finished(self) -> bool:
        return bool(self.finish_reason) or len(self.token_ids) >= self.max_new_tokens

    def step(self) -> Step | None:
        """Make the next token and return its Step (None once finished)."""
        if self.finished:
            return None
        start = time.perf_counter()
        trace = Trace() if self.record else None
        logits = self._next_logits(trace)                                  # (vocab,)
        token, self.last_probs = sample(logits, params=self.params, previous_ids=self.ids,
                                        generator=self.generator)
        timing.sync(self.model.device)           # the token exists only once the device is done
        return self.add_token(token, logits, time.perf_counter() - start, trace)

    def run(self, n: int | None = None) -> list[Step]:
        """Step n times (default: to the end); returns the Steps made."""
        made = []
        for _ in range(self.max_new_tokens if n is None else n):
            step = self.step()
            if step is None:
                break
            made.append(step)
        return made

    def _next_logits(self, trace: Trace | None) -> torch.Tensor:
        if self.cache is None:                   # the baseline: everything again, every step
            return recompute(self.model, torch.tensor(self.ids, device=self.model.device), trace)
        if not self.steps:
            return prefill(self.model, self.prompt_ids, self.cache, trace)
        newest = torch.tensor([self.ids[-1]], device=self.model.device)   # (1,): the only new input
        return decode_one_token(self.model, newest, self.cache, trace)

    def add_token(self, token: int, logits: torch.Tensor, seconds: float, trace: Trace | None = None) -> Step:
        """Record a chosen token: its Step, the text it completes, and whether
        it ends the generation. step() calls it; so does speculative decoding,
        for every token a verifying pass keeps. logits (vocab,): the scores the
        token was chosen from."""
        gen, index = self.generation, len(self.steps)
        self.ids.append(token)
        gen.token_ids.append(token)
        self.last_logits = logits
        emitted = time.perf_counter() - self.requested_at
        step = Step(index, token, self._streamer.add(token), token_probability(logits, token), seconds,
                    self.cache.length if self.cache else 0, self.cache.nbytes if self.cache else 0,
                    "prefill" if index == 0 else "decode", newest_attention_row(trace) if trace else None,
                    emitted)
        gen.steps.append(step)
        if index == 0:
            gen.prefill_trace = trace
        gen.finish_reason = self._finish_reason(token)
        if gen.finish_reason:
            step.text += self._streamer.flush()
        gen.text = cut_at_stop(self._streamer.emitted, self.stops)
        return step

    def _finish_reason(self, token: int) -> str:
        if token in self.eos:
            return "eos"
        if any(s in self._streamer.emitted for s in self.stops):
            return "stop"
        if len(self.token_ids) == self.max_new_tokens:
            return "length"
        return ""


def generate(model, prompt, max_new_tokens: int = 32, method: str = "greedy", *,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             min_p: float | None = None, repetition_penalty: float = 1.0, seed: int | None = None,
             params: SamplingParams | None = None, use_cache: bool = True,
             stop: list[str] | str | None = None, on_token: Callable[[str, Step], None] | None = None,
             chat: bool = False, system: str | None = None, num_beams: int = 4, record: bool = False,
             stop_at_eos: bool = True, kv_dtype: str | None = None) -> Generation:
    """Generate a continuation of `prompt`.

    prompt: text, a conversation (list of {"role", "content"}), an Encoding, or token ids.
    method: "greedy", "temperature", "top_k", "top_p", "min_p" (see labkit.sample) or "beam".
    params: the sampling settings as one SamplingParams; given, it replaces method and its keywords.
    use_cache: False recomputes the whole sequence every step (the no-cache baseline).
    stop: stop strings; generation ends once the text contains one (it is cut off).
    on_token: called as on_token(piece, step) for each step, pieces never split a character.
    record: keep each step's attention row (and the prefill's Trace); uses the by-hand path.
    kv_dtype: None keeps the KV cache in the model's dtype; "int8" quantizes it (labkit.kv_quant).
    """
    if method == "beam" and params is None and kv_dtype is not None:
        raise ValueError(f"kv_dtype={kv_dtype!r} is not supported with method='beam' (beam search keeps "
                         f"its cache in the model's dtype); use kv_dtype=None")
    if method == "beam" and params is None:
        return beam_search(model, prompt, max_new_tokens, num_beams, chat=chat, system=system,
                           stop_at_eos=stop_at_eos, on_token=on_token)
    params = params or SamplingParams(method, temperature, top_k, top_p, min_p, repetition_penalty, seed)
    decoder = Decoder(model, prompt, max_new_tokens, params, use_cache=use_cache, record=record, stop=stop,
                      stop_at_eos=stop_at_eos, chat=chat, system=system, kv_dtype=kv_dtype)
    while (step := decoder.step()) is not None:
        if on_token:
            on_token(step.text, step)
    return decoder.generation


# ----------------------------------------------------------------------------
# Beam search
# ----------------------------------------------------------------------------

@torch.inference_mode()
def beam_search(model, prompt, max_new_tokens: int = 32, num_beams: int = 4, *, chat: bool = False,
                system: str | None = None, stop_at_eos: bool = True,
                on_token: Callable[[str, Step], None] | None = None,
                length_penalty: float = 1.0) -> Generation:
    """Keep the num_beams most likely sequences.

    Two scores, as in Hugging Face's beam search: during the search beams are
    ranked by their total log-probability (all running beams have the same
    length, so totals compare fairly); the final answer is the best finished
    hypothesis by total / length ** length_penalty, because finished ones
    differ in length and every extra token makes a total more negative
    (without the division the shortest answer would win).

    Each step scores every beam's every next token, keeps the best 2 x
    num_beams candidates, sets aside those that end in EOS as finished
    hypotheses, and continues with the best num_beams others. The cache holds
    one row per beam (num_beams x a greedy run's bytes) and is reordered every
    step so that its rows follow the beams that were kept; here that copies
    the whole cache each step, where a paged cache (vLLM) shares the common
    prefix's blocks between beams and copies only on write. on_token gets the
    whole text once, at the end (the best beam is known only then).
    """
    if not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be an integer >= 1, got {num_beams!r}")
    requested_at = time.perf_counter()
    text, ids = read_prompt(model, prompt, chat, system)
    check_length(model, len(ids), max_new_tokens)
    gen = Generation(text, ids.tolist(), tokenize_s=time.perf_counter() - requested_at)
    if max_new_tokens == 0:
        return gen
    eos = eos_ids(model) if stop_at_eos else set()
    cache = model.new_cache(max_len=len(ids) + max_new_tokens)
    start = time.perf_counter()
    logits = prefill(model, ids.to(model.device), cache)                   # (vocab,)
    cache.reorder(torch.zeros(num_beams, dtype=torch.long, device=model.device))
    logp = logits.float().log_softmax(-1)[None].expand(num_beams, -1)      # (beams, vocab)
    scores = torch.full((num_beams,), float("-inf"), device=model.device)
    scores[0] = 0.0                                       # all beams start as one: count it once
    beams: list[list[int]] = [[] for _ in range(num_beams)]
    finished: list[tuple[float, list[int]]] = []
    for index in range(max_new_tokens):
        if index > 0:
            tokens = torch.tensor([[b[-1]] for b in beams], device=model.device)   # (beams, 1)
            logp = decode_one_token(model, tokens, cache).float().log_softmax(-1)  # (beams, vocab)
        vocab = logp.shape[-1]
        total = (scores[:, None] + logp).view(-1)                          # (beams * vocab,)
        top_scores, top_idx = total.topk(2 * num_beams)
        next_beams, next_scores, rows = [], [], []
        for score, flat in zip(top_scores.tolist(), top_idx.tolist()):
            row, token = divmod(flat, vocab)
            if token in eos:
                finished.append((score / (len(beams[row]) + 1) ** length_penalty, beams[row] + [token]))
                continue
            next_beams.append(beams[row] + [token])
            next_scores.append(score)
            rows.append(row)
            if len(next_beams) == num_beams:
                break
        beams = next_beams
        scores = torch.tensor(next_scores, device=model.device)
        cache.reorder(torch.tensor(rows, device=model.device))
        timing.sync(model.device)
        now = time.perf_counter()
        gen.steps.append(Step(index, beams[0][-1], "", math.exp(float(logp[rows[0], beams[0][-1]])),
                              now - start, cache.length, cache.nbytes,
                              "prefill" if index == 0 else "decode", at_s=now - requested_at))
        start = time.perf_counter()
        # Stop once num_beams hypotheses have finished and none running can beat them.
        if len(finished) >= num_beams:
            best_running = scores.max().item() / (len(beams[0]) ** length_penalty)
            if best_running <= min(f[0] for f in sorted(finished, reverse=True)[:num_beams]):
                break
    for score, beam in zip(scores.tolist(), beams):
        finished.append((score / len(beam) ** length_penalty, beam))
    best = max(finished, key=lambda f: f[0])[1]
    gen.token_ids = best
    gen.finish_reason = "eos" if best and best[-1] in eos else "length"
    gen.cache = cache
    gen.text = model.tokenizer.decode(best, skip_special_tokens=True)
    if on_token and gen.steps:
        on_token(gen.text, gen.steps[-1])
    return gen
