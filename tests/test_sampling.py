"""Stage 3: the sampling filters, checked against their definitions.

Every expected value comes from outside labkit.sampling: the definitions
written out here in float64 numpy, hand-made inputs whose answer is exact, or
transformers' own logits processors (the ones `model.hf.generate` uses).
"""

import dataclasses
import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

import labkit
from labkit.sampling import SamplingParams, distribution, sample, token_probability

VOCAB = 50


def logits(seed=0):
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 2


def real_like_logits(seed=0, vocab=49152):
    """A vocabulary-sized vector with the spread of SmolLM2's logits (std ~3.5)."""
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 3.5


def softmax64(x, temperature=1.0):
    """softmax(x / T), written out in float64 (-inf gives probability 0)."""
    x = np.asarray(x, dtype=np.float64) / temperature
    e = np.exp(x - x.max())
    return e / e.sum()


def kept(p) -> set[int]:
    return set(torch.nonzero(torch.as_tensor(p) > 0).flatten().tolist())


def hf_distribution(x, temperature=1.0, top_k=None, top_p=None, min_p=None, penalty=1.0, previous=()):
    """The same pipeline built from transformers' logits processors, in the order its generate uses."""
    scores = x.float()[None].clone()
    ids = torch.tensor([list(previous)], dtype=torch.long)
    if penalty != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(penalty)(ids, scores)
    scores = TemperatureLogitsWarper(temperature)(ids, scores)
    if top_k is not None:
        scores = TopKLogitsWarper(top_k)(ids, scores)
    if top_p is not None:
        scores = TopPLogitsWarper(top_p)(ids, scores)
    if min_p is not None:
        scores = MinPLogitsWarper(min_p)(ids, scores)
    return scores.softmax(-1)[0]


# ----------------------------------------------------------------------------
# top-k, top-p, min-p against their definitions
# ----------------------------------------------------------------------------

def test_top_k_keeps_exactly_k():
    x = logits()
    ranked = np.argsort(-x.numpy())
    for k in (1, 2, 3, 17, VOCAB - 1, VOCAB, VOCAB + 10):
        p = distribution(x, "top_k", top_k=k)
        keep = ranked[:min(k, VOCAB)]
        assert kept(p) == set(keep.tolist())
        ref = np.zeros(VOCAB)
        ref[keep] = softmax64(x.numpy()[keep])             # the kept logits, renormalised
        np.testing.assert_allclose(p.numpy(), ref, atol=1e-6, rtol=1e-5)


def test_top_k_keeps_ties_with_the_kth():
    # As transformers does: a token tied with the k-th largest logit is not cut.
    x = torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0])
    assert kept(distribution(x, "top_k", top_k=2)) == {0, 2, 3}
    assert kept(distribution(x, "top_k", top_k=1)) == {0}


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.99])
def test_top_p_keeps_smallest_set_reaching_p(top_p):
    raw = softmax64(logits(1).numpy())
    p = distribution(logits(1), "top_p", top_p=top_p)
    order = np.argsort(-raw)
    n = int(np.searchsorted(np.cumsum(raw[order]), top_p) + 1)   # first prefix whose mass reaches p
    assert kept(p) == set(order[:n].tolist())
    assert raw[order[:n]].sum() >= top_p and raw[order[:n - 1]].sum() < top_p
    ref = np.zeros(VOCAB)
    ref[order[:n]] = raw[order[:n]] / raw[order[:n]].sum()
    np.testing.assert_allclose(p.numpy(), ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("top_p, n", [(0.2, 1), (0.25, 1), (0.3, 2), (0.5, 2), (0.6, 3), (0.75, 3), (0.8, 4)])
def test_top_p_boundary_is_exact(top_p, n):
    """Four equal logits: each token has mass exactly 1/4 (exact in binary), so a
    set that reaches p exactly must stop there; one that falls short must not."""
    p = distribution(torch.zeros(4), "top_p", top_p=top_p)
    assert len(kept(p)) == n
    assert torch.allclose(p[p > 0], torch.full((n,), 1 / n))


def test_top_p_one_keeps_every_token():
    x = torch.tensor([10.0, 0.0, -10.0, -12.0])          # a tail far below float32's epsilon of the total
    assert kept(distribution(x, "top_p", top_p=1.0)) == {0, 1, 2, 3}
    assert kept(distribution(x, "top_p", top_p=0.99)) == {0}
    assert kept(distribution(x, "top_p", top_p=0.999999)) == {0, 1}   # p(0) = 1 - 4.5e-5


def test_min_p():
    raw = softmax64(logits(2).numpy())
    for m in (0.01, 0.05, 0.14):
        p = distribution(logits(2), "min_p", min_p=m)
        keep = raw >= m * raw.max()
        assert 1 < keep.sum() < VOCAB                      # the threshold cuts somewhere
        assert kept(p) == set(np.nonzero(keep)[0].tolist())
        np.testing.assert_allclose(p.numpy(), np.where(keep, raw, 0) / raw[keep].sum(), atol=1e-6, rtol=1e-5)


def test_min_p_boundary():
    # min_p = 1 keeps exactly the tokens as likely as the most likely one (ties included) ...
    p = distribution(torch.tensor([1.0, 1.0, 0.0, -1.0]), "min_p", min_p=1.0)
    assert torch.equal(p, torch.tensor([0.5, 0.5, 0.0, 0.0]))
    # ... and min_p = 0 keeps every token (it is not replaced by the default 0.05).
    x = torch.tensor([10.0, 0.0, -10.0])
    assert kept(distribution(x, "min_p", min_p=0.0)) == {0, 1, 2}
    assert kept(distribution(x, "min_p")) == {0}           # the default 0.05 cuts p = 4.5e-5


# transformers' processors as the reference: every method, the defaults, filters combined.
HF_CASES = [
    ("temperature", dict(temperature=0.7), dict(temperature=0.7)),
    ("temperature", dict(temperature=1.0, top_k=5), dict(top_k=5)),          # a given filter applies too
    ("top_k", dict(temperature=1.3, top_k=10), dict(temperature=1.3, top_k=10)),
    ("top_k", dict(), dict(top_k=50)),                                        # default k = 50
    ("top_p", dict(temperature=0.8, top_p=0.7), dict(temperature=0.8, top_p=0.7)),
    ("top_p", dict(), dict(top_p=0.9)),                                       # default p = 0.9
    ("min_p", dict(temperature=1.5, min_p=0.1), dict(temperature=1.5, min_p=0.1)),
    ("min_p", dict(), dict(min_p=0.05)),                                      # default min_p = 0.05
    ("top_p", dict(temperature=0.6, top_k=40, top_p=0.9, min_p=0.02),
     dict(temperature=0.6, top_k=40, top_p=0.9, min_p=0.02)),
    ("top_k", dict(temperature=3.0, top_k=200, min_p=0.3), dict(temperature=3.0, top_k=200, min_p=0.3)),
]


@pytest.mark.parametrize("method, ours, theirs", HF_CASES)
def test_filters_match_transformers(method, ours, theirs):
    x = real_like_logits(5, vocab=1000)
    p = distribution(x, method, **ours)
    ref = hf_distribution(x, **theirs)
    if set(theirs) != {"temperature"}:
        assert 1 < len(kept(ref)) < 1000                  # the filter did cut something (but not all)
    assert kept(p) == kept(ref)
    assert torch.allclose(p, ref, atol=1e-6, rtol=1e-4)


def test_repetition_penalty_matches_transformers():
    x = real_like_logits(6, vocab=1000)
    previous = [int(x.argmax()), int(x.argmin()), 17, 17, 400, 3]       # positive and negative, a repeat
    for penalty in (0.7, 1.3, 2.0):
        p = distribution(x, "top_p", top_p=0.95, temperature=0.9, repetition_penalty=penalty,
                         previous_ids=previous)
        ref = hf_distribution(x, temperature=0.9, top_p=0.95, penalty=penalty, previous=previous)
        assert kept(p) == kept(ref)
        assert torch.allclose(p, ref, atol=1e-6, rtol=1e-4)


# ----------------------------------------------------------------------------
# Temperature
# ----------------------------------------------------------------------------

def test_temperature_zero_is_greedy():
    for seed in range(5):
        token, p = sample(logits(seed), "temperature", temperature=0, seed=seed)
        assert token == int(np.argmax(logits(seed).numpy()))
        assert p[token] == 1.0 and p.sum() == 1.0
    assert sample(logits(), "greedy")[0] == int(np.argmax(logits().numpy()))
    # greedy ignores the temperature it is given
    assert sample(logits(), "greedy", temperature=5.0)[0] == int(np.argmax(logits().numpy()))


@pytest.mark.parametrize("t", [1e-3, 5e-3, 9.9e-3, 0.01, 0.05, 0.3, 1.0, 3.0, 10.0])
def test_temperature_is_softmax_of_logits_over_t(t):
    x = real_like_logits(0)
    p = distribution(x, "temperature", temperature=t)
    np.testing.assert_allclose(p.numpy(), softmax64(x.numpy(), t), atol=1e-6, rtol=1e-4)


def test_low_temperature_is_nearly_greedy_on_ordinary_logits():
    """Logits with the spread of a real model's: T = 1 leaves the distribution
    wide, a low T (also below 0.01) makes it one-hot on the argmax."""
    x = real_like_logits(0)
    top2 = x.topk(2).values
    assert top2[0] - top2[1] > 1.0                        # the argmax is clear (measured: 1.61)
    top = int(x.argmax())
    wide = distribution(x, "temperature", temperature=1.0)
    assert wide[top] < 0.5                                # measured: 0.33
    for t in (0.05, 0.02, 0.009, 0.005, 1e-3, 1e-4):
        p = distribution(x, "temperature", temperature=t)
        assert p[top] > 0.99, t                           # measured: 1.0 for each
        assert sample(x, "temperature", temperature=t, seed=0)[0] == top


def test_temperature_extremes_are_finite():
    big = logits() * 30
    for t in (1e-4, 1e-2, 1.0, 10.0, 100.0):
        p = distribution(big, "temperature", temperature=t)
        assert torch.isfinite(p).all() and math.isclose(p.sum().item(), 1.0, rel_tol=1e-4)
        np.testing.assert_allclose(p.numpy(), softmax64(big.numpy(), t), atol=1e-6, rtol=1e-4)
    assert distribution(big, "temperature", temperature=1e-4).max() > 0.99   # nearly greedy
    flat = distribution(big, "temperature", temperature=100.0)
    assert flat.max() < 50 * flat.min()                                       # far from one-hot


def test_temperature_scales_logits():
    p = distribution(logits(), "temperature", temperature=0.5)
    np.testing.assert_allclose(p.numpy(), softmax64(logits().numpy(), 0.5), atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------
# Repetition penalty (CTRL: divide a positive logit, multiply a negative one)
# ----------------------------------------------------------------------------

def ctrl_penalty(x, previous, penalty):
    out = list(x)
    for i in set(previous):
        out[i] = out[i] / penalty if out[i] > 0 else out[i] * penalty
    return out


@pytest.mark.parametrize("penalty", [2.0, 0.5])
def test_repetition_penalty(penalty):
    x = [2.0, -1.0, 0.5, 0.1, -0.3]
    previous = [0, 1, 0, 0, 4]                            # a repeated token is penalised once
    p = distribution(torch.tensor(x), "temperature", repetition_penalty=penalty, previous_ids=previous)
    np.testing.assert_allclose(p.numpy(), softmax64(ctrl_penalty(x, previous, penalty)), rtol=1e-5)
    if penalty == 2.0:   # the rule written out by hand once more
        np.testing.assert_allclose(p.numpy(), softmax64([1.0, -2.0, 0.5, 0.1, -0.6]), rtol=1e-5)


def test_repetition_penalty_changes_greedy_and_needs_previous_ids():
    x = torch.tensor([2.0, 1.5, -1.0])
    assert sample(x, "greedy", repetition_penalty=2.0, previous_ids=[0])[0] == 1      # 2/2 = 1 < 1.5
    assert sample(x, "greedy", repetition_penalty=2.0, previous_ids=[1])[0] == 0
    assert sample(x, "greedy", repetition_penalty=1.2, previous_ids=[0])[0] == 0      # 2/1.2 > 1.5
    for previous in (None, []):
        p = distribution(x, "temperature", repetition_penalty=2.0, previous_ids=previous)
        np.testing.assert_allclose(p.numpy(), softmax64(x.numpy()), rtol=1e-6)
    p = distribution(x, "temperature", repetition_penalty=1.0, previous_ids=[0, 1, 2])
    np.testing.assert_allclose(p.numpy(), softmax64(x.numpy()), rtol=1e-6)


# ----------------------------------------------------------------------------
# Drawing
# ----------------------------------------------------------------------------

def test_seed_repeats_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = [sample(logits(), "temperature", seed=7)[0] for _ in range(3)]
    after = torch.rand(1)
    assert torch.equal(before, after)                 # the global stream was not touched
    b = [sample(logits(), "temperature", seed=7)[0] for _ in range(3)]
    assert a == b
    g = labkit.sampling.make_generator(7)
    draws = {sample(logits(), "temperature", generator=g)[0] for _ in range(30)}
    assert len(draws) > 1                             # a generator advances


def test_seed_is_a_torch_generator_seeded_with_it():
    """seed=s draws what torch.multinomial draws with torch.Generator().manual_seed(s)."""
    x = real_like_logits(3, vocab=1000) / 3           # wide: draws at different seeds differ
    draws = []
    for seed in range(8):
        token, p = sample(x, "temperature", temperature=1.0, seed=seed)
        np.testing.assert_allclose(p.numpy(), softmax64(x.numpy()), atol=1e-6, rtol=1e-4)
        expected = int(torch.multinomial(p, 1, generator=torch.Generator().manual_seed(seed)))
        assert token == expected
        draws.append(token)
    assert len(set(draws)) > 4                        # measured: 8 different tokens
    g = torch.Generator().manual_seed(11)
    g_ref = torch.Generator().manual_seed(11)
    for _ in range(5):                                # a generator passed in is used and advanced
        token, p = sample(x, "temperature", generator=g)
        assert token == int(torch.multinomial(p, 1, generator=g_ref))


def test_empirical_frequencies_match_distribution():
    """Chi-square goodness of fit at a fixed seed over 20,000 draws."""
    x = logits(3)
    keep = np.argsort(-x.numpy())[:8]
    ref = softmax64(x.numpy()[keep])                      # top 8, renormalised, in float64
    g = labkit.sampling.make_generator(0)
    n = 20000
    draws = torch.tensor([sample(x, "top_k", top_k=8, generator=g)[0] for _ in range(n)])
    observed = np.array([int((draws == int(k)).sum()) for k in keep])
    assert observed.sum() == n                        # nothing outside the top 8 was drawn
    assert (observed > 0).all()
    _, pvalue = chisquare(observed, ref * n)
    assert pvalue > 0.001


# ----------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, name", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature="1"), "temperature"),
    (dict(method="top_p", top_p=0.0), "top_p"),
    (dict(method="top_p", top_p=1.5), "top_p"),
    (dict(method="top_p", top_p=-0.5), "top_p"),
    (dict(method="top_k", top_k=0), "top_k"),
    (dict(method="top_k", top_k=2.5), "top_k"),
    (dict(method="top_k", top_k=True), "top_k"),
    (dict(method="min_p", min_p=2.0), "min_p"),
    (dict(method="min_p", min_p=-0.1), "min_p"),
    (dict(method="nucleus"), "method"),
    (dict(method="beam"), "method"),
    (dict(repetition_penalty=0), "repetition_penalty"),
    (dict(repetition_penalty=-1.5), "repetition_penalty"),
])
def test_bad_parameters_name_themselves(kwargs, name):
    kwargs = {"method": "temperature", **kwargs}
    method = kwargs.pop("method")
    with pytest.raises(ValueError, match=name):
        sample(logits(), method, **kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(temperature=0), dict(temperature=1), dict(method="top_k", top_k=1),
    dict(method="top_p", top_p=1), dict(method="min_p", min_p=0), dict(method="min_p", min_p=1),
    dict(repetition_penalty=1e-3),
])
def test_edge_parameters_are_accepted(kwargs):
    kwargs = {"method": "temperature", **kwargs}
    method = kwargs.pop("method")
    token, p = sample(logits(), method, seed=0, **kwargs)
    assert 0 <= token < VOCAB and math.isclose(p.sum().item(), 1.0, rel_tol=1e-5)


def test_bad_logits_are_refused():
    with pytest.raises(ValueError, match="shape"):
        distribution(torch.zeros(2, VOCAB), "temperature")
    with pytest.raises(ValueError, match="NaN"):
        distribution(torch.tensor([0.0, float("nan"), 1.0]), "temperature")


# ----------------------------------------------------------------------------
# SamplingParams: the settings as one value, checked once
# ----------------------------------------------------------------------------

def test_sampling_params_are_checked_when_made():
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams("top_p", top_p=0)
    with pytest.raises(ValueError, match="method must be one of"):
        SamplingParams("nucleus")
    p = SamplingParams("top_k", temperature=0.7, top_k=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.top_k = 0                                       # stays valid: no setting changes after the check
    assert dataclasses.replace(p, top_k=3).top_k == 3
    with pytest.raises(ValueError, match="top_k"):
        dataclasses.replace(p, top_k=0)                   # a changed copy is checked again
    assert SamplingParams().greedy and SamplingParams("temperature", temperature=0).greedy
    assert not SamplingParams("temperature").greedy


@pytest.mark.parametrize("kwargs", [
    dict(method="temperature", temperature=1.3), dict(method="top_k", temperature=0.8, top_k=7),
    dict(method="top_p", temperature=1.2, top_p=0.8), dict(method="min_p", min_p=0.1, repetition_penalty=1.4),
])
def test_params_equal_the_keywords(kwargs):
    x, previous = real_like_logits(3), [5, 9, 40]
    params = SamplingParams(**kwargs, seed=11)
    kwargs = dict(kwargs)                     # the parameter is shared by reruns: pop from a copy
    method = kwargs.pop("method")
    assert torch.equal(distribution(x, params=params, previous_ids=previous),
                       distribution(x, method, previous_ids=previous, **kwargs))
    assert [sample(x, params=params, previous_ids=previous)[0] for _ in range(3)] == \
           [sample(x, method, seed=11, previous_ids=previous, **kwargs)[0] for _ in range(3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_probability_is_the_softmax_entry(dtype):
    x = real_like_logits(4).to(dtype)
    reference = softmax64(x.float().numpy())
    for token in (0, int(x.argmax()), 12345):
        assert token_probability(x, token) == pytest.approx(reference[token], rel=1e-5, abs=1e-12)
