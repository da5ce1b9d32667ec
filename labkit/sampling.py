"""Stage 3, sample: pick the next token from the logits.

The filters run in the order transformers uses:

    repetition penalty -> temperature -> top-k -> top-p -> min-p -> softmax -> draw

Engines differ: llama.cpp's sampler chain is configurable and by default
applies temperature after top-k, top-p and min-p, so there the cut-offs see
the untempered distribution. The order changes which tokens survive.

`distribution` returns the final probabilities, so a chart can show which
tokens were kept and which were cut; `sample` also draws a token from them.
Greedy (and temperature 0) picks the most likely token; its distribution is
one-hot on that token, since that is what it "samples" from.

The settings travel as one `SamplingParams` (checked once, when made);
`sample` and `distribution` take it as `params=`, or the same settings as
keywords. A seed gives a run its own `torch.Generator`, so results repeat
without touching the global random state.

`token_probability` is the model's own probability of a token (softmax at
temperature 1), what generate records for every step.

Beam search keeps several sequences at once, so it lives in labkit.generation
(`generate(method="beam")`), not here. Left out: typical-p, eta/epsilon sampling,
frequency/presence penalties.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

METHODS = ("greedy", "temperature", "top_k", "top_p", "min_p")
DEFAULTS = {"top_k": 50, "top_p": 0.9, "min_p": 0.05}


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token, as one value (vLLM's `SamplingParams`).

    Checked once, when it is made: a bad value raises a ValueError naming the
    parameter and its allowed values. Frozen, so it stays valid; make another
    (dataclasses.replace) to change a setting.
    """

    method: str = "greedy"                 # one of METHODS
    temperature: float = 1.0               # 0 means greedy
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0        # 1 means none
    seed: int | None = None                # None: the global random stream

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)} (or 'beam' in generate), "
                             f"got {self.method!r}")
        t = self.temperature
        if not isinstance(t, (int, float)) or t != t or t < 0:
            raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {t!r}")
        k = self.top_k
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
            raise ValueError(f"top_k must be an integer >= 1, got {k!r}")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.min_p is not None and not (isinstance(self.min_p, (int, float)) and 0 <= self.min_p <= 1):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        r = self.repetition_penalty
        if not (isinstance(r, (int, float)) and r > 0):
            raise ValueError(f"repetition_penalty must be > 0 (1 means none), got {r!r}")

    @property
    def greedy(self) -> bool:
        """True when the choice is the argmax (greedy, or temperature 0)."""
        return self.method == "greedy" or self.temperature == 0


def apply_repetition_penalty(logits: torch.Tensor, previous_ids, penalty: float) -> torch.Tensor:
    """Make tokens already in the text less likely: a positive logit is
    divided by the penalty, a negative one multiplied by it.

    That two-sided rule is Hugging Face's (transformers'
    RepetitionPenaltyLogitsProcessor; llama.cpp and vLLM follow it). The CTRL
    paper (Keskar et al. 2019), where the penalty comes from, only divides,
    which would make a negative logit *more* likely."""
    if penalty == 1.0 or previous_ids is None or len(previous_ids) == 0:
        return logits
    idx = torch.as_tensor(previous_ids, dtype=torch.long, device=logits.device).unique()
    chosen = logits[idx]
    logits = logits.clone()
    logits[idx] = torch.where(chosen > 0, chosen / penalty, chosen * penalty)
    return logits


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits, set the rest to -inf (top-k sampling, Fan et al. 2018).
    Ties with the k-th logit are kept too."""
    k = min(k, logits.shape[-1])
    kth = logits.topk(k).values[-1]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus (top-p) sampling, Holtzman et al. 2020: keep the smallest set of
    most likely tokens whose mass reaches p."""
    probs, order = logits.softmax(-1).sort(descending=True)
    mass_before = probs.cumsum(-1) - probs       # mass of the tokens ranked above each one
    drop_sorted = mass_before >= p               # the set already reached p without it
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens at least min_p times as likely as the most likely one
    (min-p sampling, Nguyen et al. 2024)."""
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < min_p * probs.max(), float("-inf"))


def distribution(logits: torch.Tensor, method: str = "greedy", *, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                 repetition_penalty: float = 1.0, previous_ids=None,
                 params: SamplingParams | None = None) -> torch.Tensor:
    """The probabilities (vocab,) that `sample` draws from, in fp32.

    method picks the filter ("top_k" uses top_k, default 50; "top_p" uses top_p,
    default 0.9; "min_p" uses min_p, default 0.05); any other filter whose
    parameter is given applies too, as in transformers.
    params: the settings as one SamplingParams, instead of method and the keywords.
    previous_ids: the tokens so far, for the repetition penalty.
    """
    p = params or SamplingParams(method, temperature, top_k, top_p, min_p, repetition_penalty)
    logits = torch.as_tensor(logits)
    if logits.dim() != 1:
        raise ValueError(f"logits must be one position's scores, shape (vocab,), got {tuple(logits.shape)}")
    logits = logits.float()
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN")
    logits = apply_repetition_penalty(logits, previous_ids, p.repetition_penalty)
    if p.greedy:
        return torch.zeros_like(logits).scatter_(0, logits.argmax().view(1), 1.0)
    top_k, top_p, min_p = p.top_k, p.top_p, p.min_p
    if p.method == "top_k":
        top_k = top_k or DEFAULTS["top_k"]
    elif p.method == "top_p":
        top_p = top_p or DEFAULTS["top_p"]
    elif p.method == "min_p":
        min_p = min_p if min_p is not None else DEFAULTS["min_p"]
    # Dividing in fp32 and letting softmax subtract the maximum keeps
    # temperatures from 1e-4 to 100 free of inf and NaN.
    logits = logits / p.temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1:
        logits = top_p_filter(logits, top_p)
    if min_p:
        logits = min_p_filter(logits, min_p)
    return logits.softmax(-1)


def token_probability(logits: torch.Tensor, token: int) -> float:
    """softmax(logits)[token] at temperature 1, computed as
    exp(logit - logsumexp(logits)): one number, without keeping a normalised
    vocabulary-sized probability vector."""
    logits = logits.float()
    return float((logits[token] - logits.logsumexp(-1)).exp())


def make_generator(seed: int | None, device: str | torch.device = "cpu") -> torch.Generator | None:
    """A private random stream (None: use the global one)."""
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def sample(logits: torch.Tensor, method: str = "greedy", *, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
           repetition_penalty: float = 1.0, previous_ids=None, seed: int | None = None,
           generator: torch.Generator | None = None,
           params: SamplingParams | None = None) -> tuple[int, torch.Tensor]:
    """Pick the next token. Returns (token_id, probs), probs being the final
    distribution it was drawn from (see `distribution`).

    params: the settings (seed included) as one SamplingParams, instead of
    method and the keywords. generator: a random stream to draw from, kept
    across calls (generate makes one from the seed); without it, the seed
    starts a new one for this draw."""
    p = params or SamplingParams(method, temperature, top_k, top_p, min_p, repetition_penalty, seed)
    probs = distribution(logits, params=p, previous_ids=previous_ids)
    if p.greedy:
        return int(probs.argmax()), probs
    if generator is None:
        generator = make_generator(p.seed, probs.device)
    token = torch.multinomial(probs, 1, generator=generator)
    return int(token), probs
