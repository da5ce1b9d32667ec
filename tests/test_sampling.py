"""Stage 3: the sampling filters, checked against their definitions."""

import math

import pytest
import torch
from scipy.stats import chisquare

import labkit
from labkit.sampling import distribution, sample

VOCAB = 50


def logits(seed=0):
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 2


def test_top_k_keeps_exactly_k():
    for k in (1, 3, 17):
        p = distribution(logits(), "top_k", top_k=k)
        assert (p > 0).sum() == k
        kept = set(torch.nonzero(p).flatten().tolist())
        assert kept == set(logits().topk(k).indices.tolist())
        assert math.isclose(p.sum().item(), 1.0, rel_tol=1e-5)


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.99])
def test_top_p_keeps_smallest_set_reaching_p(top_p):
    raw = logits(1).softmax(-1)
    p = distribution(logits(1), "top_p", top_p=top_p)
    n = int((p > 0).sum())
    ranked = raw.sort(descending=True).values
    assert ranked[:n].sum() >= top_p - 1e-6          # the kept set reaches p ...
    assert ranked[:n - 1].sum() < top_p              # ... and one token fewer would not
    assert torch.allclose(p[p > 0], raw[p > 0] / raw[p > 0].sum())


def test_min_p():
    raw = logits(2).softmax(-1)
    p = distribution(logits(2), "min_p", min_p=0.2)
    assert torch.equal(p > 0, raw >= 0.2 * raw.max())


def test_temperature_zero_is_greedy():
    for seed in range(5):
        token, p = sample(logits(seed), "temperature", temperature=0, seed=seed)
        assert token == logits(seed).argmax().item()
        assert p[token] == 1.0 and p.sum() == 1.0
    assert sample(logits(), "greedy")[0] == logits().argmax().item()


def test_temperature_extremes_are_finite():
    big = logits() * 30
    for t in (1e-4, 1e-2, 1.0, 10.0, 100.0):
        p = distribution(big, "temperature", temperature=t)
        assert torch.isfinite(p).all() and math.isclose(p.sum().item(), 1.0, rel_tol=1e-4)
    assert distribution(big, "temperature", temperature=1e-4).max() > 0.99   # nearly greedy
    flat = distribution(big, "temperature", temperature=100.0)
    assert flat.max() < 5 * flat.min() * 10                                   # nearly uniform


def test_temperature_scales_logits():
    p = distribution(logits(), "temperature", temperature=0.5)
    assert torch.allclose(p, (logits() / 0.5).softmax(-1), atol=1e-6)


def test_repetition_penalty():
    x = torch.tensor([2.0, -1.0, 0.5, 0.1])
    p = distribution(x, "temperature", repetition_penalty=2.0, previous_ids=[0, 1])
    expected = torch.tensor([1.0, -2.0, 0.5, 0.1]).softmax(-1)
    assert torch.allclose(p, expected)


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


def test_empirical_frequencies_match_distribution():
    """Chi-square goodness of fit at a fixed seed over 20,000 draws."""
    p = distribution(logits(3), "top_k", top_k=8)
    g = labkit.sampling.make_generator(0)
    n = 20000
    draws = torch.tensor([sample(logits(3), "top_k", top_k=8, generator=g)[0] for _ in range(n)])
    kept = torch.nonzero(p).flatten()
    observed = torch.stack([(draws == k).sum() for k in kept]).numpy()
    assert observed.sum() == n                        # nothing outside the top 8 was drawn
    expected = p[kept].double() / p[kept].double().sum() * n
    _, pvalue = chisquare(observed, expected.numpy())
    assert pvalue > 0.001


@pytest.mark.parametrize("kwargs, name", [
    (dict(temperature=-0.1), "temperature"),
    (dict(method="top_p", top_p=0.0), "top_p"),
    (dict(method="top_p", top_p=1.5), "top_p"),
    (dict(method="top_k", top_k=0), "top_k"),
    (dict(method="min_p", min_p=2.0), "min_p"),
    (dict(method="nucleus"), "method"),
    (dict(repetition_penalty=0), "repetition_penalty"),
])
def test_bad_parameters_name_themselves(kwargs, name):
    kwargs = {"method": "temperature", **kwargs}
    method = kwargs.pop("method")
    with pytest.raises(ValueError, match=name):
        sample(logits(), method, **kwargs)
