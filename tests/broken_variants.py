"""labkit broken on purpose: variants that the test suite must catch.

Each variant patches one function of labkit for the length of a pytest run
(the repository is never touched), so "does a test fail when this is wrong?"
has an answer anyone can rerun:

    pytest tests/test_generation.py --broken generate_ignores_method -x

`python scripts/check_broken_variants.py` runs every variant against the test
files that should catch it and reports, for each, the first test that failed
(a variant that passes everything is a hole in the suite).

The variants are the ones a review of the suite proved were not caught
(issue "Tests that fail when the code is wrong"); add one whenever a test is
written for a bug: it is the proof that the test can fail.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class Variant:
    name: str
    what: str                      # the wrong behaviour, in words
    tests: tuple[str, ...]         # the test files expected to catch it
    apply: Callable                # apply(monkeypatch): patch labkit


VARIANTS: dict[str, Variant] = {}


def variant(what: str, *tests: str):
    def register(apply):
        VARIANTS[apply.__name__] = Variant(apply.__name__, what, tests, apply)
        return apply
    return register


def replace_everywhere(mp, original, replacement) -> None:
    """Point every labkit module's name for `original` at `replacement`
    (a function imported with `from .x import f` has one name per module)."""
    found = False
    for name, module in list(sys.modules.items()):
        if name == "labkit" or name.startswith("labkit."):
            for attr, value in list(vars(module).items()):
                if value is original:
                    mp.setattr(module, attr, replacement)
                    found = True
    assert found, f"{original!r} is not referenced by any labkit module"


# ----------------------------------------------------------------------------
# The variants
# ----------------------------------------------------------------------------

@variant("the one-token 16-bit branch of linear() (torch.mv, the decode path in bf16/fp16) returns zeros",
         "tests/test_forward.py", "tests/test_precision.py")
def mv_returns_zeros(mp):
    from torch import nn

    t = importlib.import_module("labkit.model")
    original = t.linear

    def linear(x, layer):
        one_token = x.numel() == x.shape[-1]
        if isinstance(layer, nn.Linear) and one_token and layer.weight.dtype in (torch.bfloat16, torch.float16):
            return x.new_zeros(*x.shape[:-1], layer.weight.shape[0])
        return original(x, layer)
    replace_everywhere(mp, original, linear)


@variant("every quantized layer (int8 and int4) returns zeros", "tests/test_quantize.py")
def quantized_layers_return_zeros(mp):
    q = importlib.import_module("labkit.quantize")

    for cls in (q.Int8Linear, q.Int4Linear):
        def forward(self, x):
            return x.new_zeros(*x.shape[:-1], self.out_features)
        mp.setattr(cls, "forward", forward)


@variant("the int4 layer's path for more than 128 rows (expand, then one matmul) returns zeros",
         "tests/test_quantize.py")
def int4_many_rows_return_zeros(mp):
    q = importlib.import_module("labkit.quantize")

    original = q.Int4Linear.forward

    def forward(self, x):
        if x.reshape(-1, self.in_features).shape[0] > q.INT4_KERNEL_MAX_ROWS:
            return x.new_zeros(*x.shape[:-1], self.out_features)
        return original(self, x)
    mp.setattr(q.Int4Linear, "forward", forward)


@variant("generate ignores the sampling method and always takes the argmax", "tests/test_generation.py")
def generate_ignores_method(mp):
    g = importlib.import_module("labkit.generation")

    original = g.sample

    def sample(logits, method="greedy", *, params=None, **kwargs):
        if params is not None:                       # the Decoder passes its SamplingParams
            params = dataclasses.replace(params, method="greedy")
        return original(logits, "greedy", params=params, **kwargs)
    mp.setattr(g, "sample", sample)


@variant("a temperature below 0.01 is silently replaced by 1.0", "tests/test_sampling.py")
def low_temperature_becomes_one(mp):
    s = importlib.import_module("labkit.sampling")

    original = s.distribution

    def distribution(logits, method="greedy", *, temperature=1.0, **kwargs):
        if 0 < temperature < 0.01:
            temperature = 1.0
        return original(logits, method, temperature=temperature, **kwargs)
    replace_everywhere(mp, original, distribution)


@variant("kl_divergence returns 3 x the reverse KL", "tests/test_precision.py", "tests/test_quantize.py")
def kl_is_three_times_reverse(mp):
    q = importlib.import_module("labkit.quantize")

    original = q.kl_divergence
    replace_everywhere(mp, original, lambda ref, logits: 3 * original(logits, ref))


@variant("GPT-2's tanh GELU is replaced by the exact (erf) GELU", "tests/test_forward.py")
def gpt2_exact_gelu(mp):
    import torch.nn.functional as F

    t = importlib.import_module("labkit.model")
    functional = types.SimpleNamespace(**{k: getattr(F, k) for k in dir(F) if not k.startswith("__")})
    functional.gelu = lambda x, approximate="none": F.gelu(x)
    mp.setattr(t, "F", functional)


@variant("percentile rounds half to even (the old formula: p90 of 1..10 gives 10)", "tests/test_batching.py")
def percentile_round_half_even(mp):
    b = importlib.import_module("labkit.batching")

    def percentile(self, q, values=None):
        v = sorted(self.latencies() if values is None else values)
        return v[min(len(v) - 1, max(0, round(q / 100 * len(v) + 0.5) - 1))]
    mp.setattr(_percentile_owner(b), "percentile", percentile)


def _percentile_owner(module):
    for value in vars(module).values():
        if isinstance(value, type) and "percentile" in vars(value):
            return value
    raise AssertionError("no class with a percentile method in labkit.batching")


@variant("the causal mask lets each query see one key past its own position",
         "tests/test_forward.py", "tests/test_cuda_graphs.py")
def causal_mask_one_too_many(mp):
    a = importlib.import_module("labkit.attention")

    original = a.causal_mask

    def causal_mask(n_queries, n_keys, start, device=None):
        return original(n_queries, n_keys, start + 1, device)
    replace_everywhere(mp, original, causal_mask)


@variant("a served request's TTFT counts from its admission into the batch, leaving out the queue",
         "tests/test_batching.py")
def ttft_from_admission(mp):
    b = importlib.import_module("labkit.batching")
    mp.setattr(b.RequestRecord, "ttft_s", property(lambda r: r.first_token_s - r.start_s))


@variant("TTFT is the prefill step alone, not the time from the request (tokenization left out)",
         "tests/test_generation.py")
def ttft_is_the_prefill(mp):
    g = importlib.import_module("labkit.generation")
    mp.setattr(g.Generation, "ttft_s",
               property(lambda gen: gen.steps[0].seconds if gen.steps else float("nan")))


@variant("TPOT is the median gap instead of the mean, (e2e - TTFT) / (N - 1)",
         "tests/test_generation.py")
def tpot_is_the_median(mp):
    g = importlib.import_module("labkit.generation")
    mp.setattr(g.Generation, "tpot_s", property(lambda gen: gen.tpot_median_s))


# ----------------------------------------------------------------------------
# pytest glue (tests/conftest.py adds the --broken option and calls this)
# ----------------------------------------------------------------------------

def apply(name: str):
    """Apply variant `name`; returns the MonkeyPatch that undoes it."""
    if name not in VARIANTS:
        raise ValueError(f"--broken must be one of {', '.join(VARIANTS)}, got {name!r}")
    import pytest

    import labkit  # noqa: F401  (every labkit module imported, so every name can be patched)
    for module in ("attention", "batching", "cuda_graphs", "generation", "measure", "model", "precision",
                   "quantize", "sampling", "speculative", "tiled_attention"):
        importlib.import_module(f"labkit.{module}")
    mp = pytest.MonkeyPatch()
    VARIANTS[name].apply(mp)
    return mp
