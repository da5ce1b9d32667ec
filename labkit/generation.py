"""The autoregressive loop: prefill, then decode one token at a time.

    prefill:  the whole prompt in one forward pass; fills the KV cache;
              its latency is TTFT (time to first token).
    decode:   one new token per step; reads every weight and the whole cache;
              its latency per token is TPOT (time per output token).

`generate` runs the loop and records every step (token, probability, latency,
cache size). `use_cache=False` recomputes the whole sequence at every step:
the "without KV cache" baseline, which gives the same greedy tokens, slower.
Beam search (`method="beam"`) keeps `num_beams` sequences as rows of one
batched cache and reorders the cache as beams are kept or dropped.

Streaming: `on_token(piece, step)` is called once a token's text is complete;
a piece never ends in half a UTF-8 character (Chinese text from a byte-level
vocabulary often needs two or three tokens per character).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .encoding import Encoding, encode
from .kv_cache import KVCache
from .sampling import check_sampling, make_generator, sample


@dataclass
class Step:
    index: int             # 0 is the token that prefill produced
    token_id: int
    text: str              # the text this step added to the output ("" while a character is incomplete)
    prob: float            # the model's probability of the token (softmax at temperature 1)
    seconds: float         # latency of this step: TTFT for step 0, a TPOT sample after
    cache_len: int         # positions in the KV cache after this step (0 without a cache)
    cache_nbytes: int      # bytes of K and V held after this step
    phase: str             # "prefill" or "decode"
    attention: torch.Tensor | None = None   # (layers, heads, keys): this token's query row, when recorded


@dataclass
class Generation:
    prompt: str
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    steps: list[Step] = field(default_factory=list)
    finish_reason: str = ""          # "eos", "length" or "stop"
    cache: KVCache | None = None
    prefill_trace: object = None     # the prefill's Trace when record=True

    @property
    def ttft_s(self) -> float:
        """Time to first token: the prefill step."""
        return self.steps[0].seconds if self.steps else float("nan")

    @property
    def tpot_s(self) -> float:
        """Time per output token: the median decode step (robust to a noisy machine)."""
        decode = sorted(s.seconds for s in self.steps[1:])
        return decode[len(decode) // 2] if decode else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return 1.0 / self.tpot_s if self.tpot_s == self.tpot_s and self.tpot_s > 0 else float("nan")

    @property
    def total_s(self) -> float:
        return sum(s.seconds for s in self.steps)

    def __repr__(self) -> str:
        return (f"Generation({self.text!r}, {len(self.token_ids)} tokens, finish={self.finish_reason!r}, "
                f"TTFT {self.ttft_s * 1e3:.1f} ms, TPOT {self.tpot_s * 1e3:.1f} ms)")


# ----------------------------------------------------------------------------
# The two phases
# ----------------------------------------------------------------------------

def prefill(model, ids: torch.Tensor, cache: KVCache | None, record: bool = False):
    """Run the whole prompt at once; return the logits of its last position."""
    out = model.forward(ids, cache=cache, record=record, last_only=True)
    logits, trace = out if record else (out, None)
    return logits[..., -1, :], trace


def decode_one_token(model, token: torch.Tensor, cache: KVCache, record: bool = False):
    """One decode step: the newest token (shape (1,) or (B, 1)) against the cache."""
    out = model.forward(token, cache=cache, record=record)
    logits, trace = out if record else (out, None)
    return logits[..., -1, :], trace


# ----------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------

class _Streamer:
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
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        piece, self.emitted = text[len(self.emitted):], text
        return piece


def _prompt_ids(model, prompt, chat: bool, system: str | None) -> tuple[str, torch.Tensor]:
    if isinstance(prompt, Encoding):
        return prompt.text, prompt.ids
    if isinstance(prompt, (str, list)) and not (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
        enc = encode(model, prompt, chat=chat, system=system)
        return enc.text, enc.ids
    ids = torch.as_tensor(prompt, dtype=torch.long).flatten()
    if ids.numel() == 0:
        raise ValueError("prompt is empty; give at least one token")
    return model.tokenizer.decode(ids) if model.tokenizer else "", ids


def eos_ids(model) -> set[int]:
    ids = set()
    for source in (getattr(model.tokenizer, "eos_token_id", None),
                   getattr(getattr(model.hf, "generation_config", None), "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)
    return ids


def generate(model, prompt, max_new_tokens: int = 32, method: str = "greedy", *,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             min_p: float | None = None, repetition_penalty: float = 1.0, seed: int | None = None,
             use_cache: bool = True, stop: list[str] | str | None = None,
             on_token: Callable[[str, Step], None] | None = None, chat: bool = False,
             system: str | None = None, num_beams: int = 4, record: bool = False,
             stop_at_eos: bool = True) -> Generation:
    """Generate a continuation of `prompt`.

    prompt: text, a conversation (list of {"role", "content"}), an Encoding, or token ids.
    method: "greedy", "temperature", "top_k", "top_p", "min_p" (see labkit.sample) or "beam".
    use_cache: False recomputes the whole sequence every step (the no-cache baseline).
    stop: stop strings; generation ends once the text contains one (it is cut off).
    on_token: called as on_token(piece, step) for each step, pieces never split a character.
    record: keep each step's attention row (and the prefill's Trace); uses the by-hand path.
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if method == "beam":
        if not isinstance(num_beams, int) or num_beams < 1:
            raise ValueError(f"num_beams must be an integer >= 1, got {num_beams!r}")
    else:
        check_sampling(method, temperature, top_k, top_p, min_p, repetition_penalty)
    text, ids = _prompt_ids(model, prompt, chat, system)
    n_prompt, limit = len(ids), model.config.max_len
    if n_prompt > limit:
        raise ValueError(f"prompt has {n_prompt} tokens, more than the model's context of {limit}")
    if n_prompt + max_new_tokens > limit:
        raise ValueError(f"max_new_tokens must be <= {limit - n_prompt} for this {n_prompt}-token "
                         f"prompt (the model's context is {limit}), got {max_new_tokens}")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    gen = Generation(text, ids.tolist())
    if max_new_tokens == 0:
        return gen
    if method == "beam":
        return _beam_search(model, gen, ids, max_new_tokens, num_beams, stop_at_eos, on_token)

    eos = eos_ids(model) if stop_at_eos else set()
    streamer = _Streamer(model.tokenizer)
    generator = make_generator(seed, model.device)
    cache = model.new_cache(max_len=n_prompt + max_new_tokens) if use_cache else None
    gen.cache = cache
    ids = ids.to(model.device)
    seq = ids
    previous = ids.tolist()
    start = time.perf_counter()
    for index in range(max_new_tokens):
        if index == 0:
            logits, trace = prefill(model, ids, cache, record)
            gen.prefill_trace = trace
        elif use_cache:
            logits, trace = decode_one_token(model, seq[-1:], cache, record)
        else:
            logits, trace = prefill(model, seq, None, record)   # recompute everything
        token, _ = sample(logits, method, temperature=temperature, top_k=top_k, top_p=top_p,
                          min_p=min_p, repetition_penalty=repetition_penalty,
                          previous_ids=previous, generator=generator)
        prob = float(logits.float().softmax(-1)[token])
        now = time.perf_counter()
        seq = torch.cat([seq, torch.tensor([token], device=seq.device)])
        previous.append(token)
        gen.token_ids.append(token)
        step = Step(index, token, streamer.add(token), prob, now - start,
                    cache.length if cache else 0, cache.nbytes if cache else 0,
                    "prefill" if index == 0 else "decode",
                    _last_row(trace) if record else None)
        gen.steps.append(step)
        finished = _finish_reason(token, eos, streamer.emitted, stops, index, max_new_tokens)
        if finished:
            step.text += streamer.flush()
        if on_token:
            on_token(step.text, step)
        if finished:
            gen.finish_reason = finished
            break
        start = time.perf_counter()
    gen.text = _cut_at_stop(streamer.emitted, stops)
    return gen


def _finish_reason(token, eos, text, stops, index, max_new_tokens) -> str:
    if token in eos:
        return "eos"
    if any(s in text for s in stops):
        return "stop"
    if index + 1 == max_new_tokens:
        return "length"
    return ""


def _cut_at_stop(text: str, stops: list[str]) -> str:
    cuts = [text.index(s) for s in stops if s in text]
    return text[:min(cuts)] if cuts else text


def _last_row(trace) -> torch.Tensor:
    """The newest query's attention over all keys, per layer: (layers, heads, keys)."""
    return torch.stack([a[:, -1, :] for a in trace.attentions]).float().cpu()


# ----------------------------------------------------------------------------
# Beam search
# ----------------------------------------------------------------------------

@torch.inference_mode()
def _beam_search(model, gen: Generation, ids, max_new_tokens, num_beams, stop_at_eos, on_token,
                 length_penalty: float = 1.0) -> Generation:
    """Keep the num_beams most likely sequences (sum of log-probabilities).

    Each step scores every beam's every next token, keeps the best 2 x
    num_beams candidates, sets aside those that end in EOS as finished
    hypotheses, and continues with the best num_beams others. The cache rows
    follow the beams that were kept. The answer is the best finished
    hypothesis by score / length ** length_penalty.
    """
    eos = eos_ids(model) if stop_at_eos else set()
    cache = model.new_cache(max_len=len(ids) + max_new_tokens)
    start = time.perf_counter()
    logits, _ = prefill(model, ids.to(model.device), cache)          # (vocab,)
    cache.reorder(torch.zeros(num_beams, dtype=torch.long, device=model.device))
    logp = logits.float().log_softmax(-1)[None].expand(num_beams, -1)
    scores = torch.full((num_beams,), float("-inf"), device=model.device)
    scores[0] = 0.0                                       # all beams start as one: count it once
    beams: list[list[int]] = [[] for _ in range(num_beams)]
    finished: list[tuple[float, list[int]]] = []
    for index in range(max_new_tokens):
        if index > 0:
            tokens = torch.tensor([[b[-1]] for b in beams], device=model.device)
            logits, _ = decode_one_token(model, tokens, cache)  # (beams, vocab)
            logp = logits.float().log_softmax(-1)
        vocab = logp.shape[-1]
        total = (scores[:, None] + logp).view(-1)
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
        now = time.perf_counter()
        gen.steps.append(Step(index, beams[0][-1], "", math.exp(float(logp[rows[0], beams[0][-1]])),
                              now - start, cache.length, cache.nbytes,
                              "prefill" if index == 0 else "decode"))
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
