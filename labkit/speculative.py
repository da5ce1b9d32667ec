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

from .generation import _prompt_ids, eos_ids, prefill


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
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if not 1 <= ngram_min <= ngram_max:
        raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
    text, ids = _prompt_ids(model, prompt, chat, system)
    n_prompt = len(ids)
    if n_prompt + max_new_tokens > model.config.max_len:
        raise ValueError(f"max_new_tokens must be <= {model.config.max_len - n_prompt} for this "
                         f"{n_prompt}-token prompt, got {max_new_tokens}")
    gen = SpeculativeGeneration(text, ids.tolist())
    if max_new_tokens == 0:
        return gen
    eos = eos_ids(model) if stop_at_eos else set()
    # Room for the longest draft past the last kept token.
    cache = model.new_cache(max_len=min(n_prompt + max_new_tokens + num_draft, model.config.max_len))
    seq = ids.tolist()
    start = time.perf_counter()

    t0 = time.perf_counter()
    logits, _ = prefill(model, ids.to(model.device), cache)
    first = int(logits.argmax())
    gen.rounds.append(Round([], 0, [first], time.perf_counter() - t0, "prefill"))
    new_tokens = [first]
    while True:
        # Keep the tokens of the last pass until EOS or the length limit.
        for t in new_tokens:
            seq.append(t)
            gen.token_ids.append(t)
            if t in eos:
                gen.finish_reason = "eos"
                break
            if len(gen.token_ids) == max_new_tokens:
                gen.finish_reason = "length"
                break
        if gen.finish_reason:
            break
        t0 = time.perf_counter()
        # Never draft past the limit: the pass itself adds one more token.
        room = max_new_tokens - len(gen.token_ids) - 1
        draft = find_draft(seq, min(num_draft, room), ngram_max, ngram_min) if room > 0 else []
        kept = cache.length                              # positions before the newest token
        tokens = torch.tensor([seq[-1]] + draft, device=model.device)
        logits = model.forward(tokens, cache=cache)      # (1 + len(draft), vocab)
        choice = logits.argmax(dim=-1).tolist()          # the model's token after each input token
        accepted = 0
        while accepted < len(draft) and draft[accepted] == choice[accepted]:
            accepted += 1
        new_tokens = draft[:accepted] + [choice[accepted]]
        cache.truncate(kept + 1 + accepted)             # forget the K/V of rejected drafts
        gen.rounds.append(Round(draft, accepted, new_tokens, time.perf_counter() - t0))
    gen.seconds = time.perf_counter() - start
    # The last round may have been cut short by EOS or the limit.
    surplus = sum(len(r.token_ids) for r in gen.rounds) - len(gen.token_ids)
    if surplus:
        last = gen.rounds[-1]
        last.token_ids = last.token_ids[:len(last.token_ids) - surplus]
        last.accepted = min(last.accepted, len(last.token_ids))
    gen.text = model.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    return gen


# ----------------------------------------------------------------------------
# Chart (data in, figure out, as in viz)
# ----------------------------------------------------------------------------

def rounds_chart(gen: SpeculativeGeneration, tokenizer=None,
                 title: str = "Speculative decoding: what each forward pass produced") -> "go.Figure":
    """One stacked bar per forward pass: draft tokens accepted (green), the
    model's own token (blue), draft tokens rejected (grey, below zero).
    With a tokenizer, hovering shows the tokens."""
    import plotly.graph_objects as go

    from . import charts

    def words(ids):
        return "".join(charts.token_label(t) for t in tokenizer.convert_ids_to_tokens(ids)) if tokenizer and ids else ""

    x = list(range(len(gen.rounds)))
    accepted = [r.accepted for r in gen.rounds]
    own = [len(r.token_ids) - r.accepted for r in gen.rounds]
    rejected = [-len(r.rejected) for r in gen.rounds]
    kept_text = [words(r.token_ids) for r in gen.rounds]
    fig = go.Figure([
        go.Bar(x=x, y=accepted, name="draft accepted", marker_color=charts.GREEN, customdata=kept_text,
               hovertemplate="pass %{x}: %{y} draft tokens accepted<br>%{customdata}<extra></extra>"),
        go.Bar(x=x, y=own, name="the model's own token", marker_color=charts.BLUE, customdata=kept_text,
               hovertemplate="pass %{x}: + the model's token<br>%{customdata}<extra></extra>"),
        go.Bar(x=x, y=rejected, name="draft rejected (rolled back)", marker_color=charts.GREY,
               customdata=[words(r.rejected) for r in gen.rounds],
               hovertemplate="pass %{x}: %{y} rejected<br>%{customdata}<extra></extra>"),
    ])
    fig.update_xaxes(title="forward pass (0 = prefill)")
    fig.update_yaxes(title="tokens (rejected below 0)")
    sub = (f"{len(gen.token_ids)} tokens in {gen.forward_passes} passes "
           f"({gen.tokens_per_pass:.2f} per pass); accepted {gen.accepted} of {gen.drafted} drafted")
    fig.update_layout(title=charts._title(title, sub), barmode="relative", width=900, height=440,
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right"))
    return charts.fit_title(fig)
