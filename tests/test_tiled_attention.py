"""labkit.tiled_attention: tiled attention with an online softmax equals ordinary attention
(labkit.attention.attention_by_hand, the whole score matrix at once)."""


import pytest
import torch
import torch.nn.functional as F

import labkit
from labkit import tiled_attention
from labkit.attention import attention_by_hand


def qkv(B=1, H=6, KV=2, T=37, S=None, d=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    S = S or T
    return (torch.randn(B, H, T, d, generator=g).to(dtype), torch.randn(B, KV, S, d, generator=g).to(dtype),
            torch.randn(B, KV, S, d, generator=g).to(dtype))


@pytest.mark.parametrize("block_size", [1, 5, 16, 37, 64])
def test_equals_attention_by_hand_prefill(block_size):
    q, k, v = qkv()
    out, stats = tiled_attention.flash_attention(q, k, v, block_size, return_stats=True)
    ref, _ = attention_by_hand(q, k, v, start=0)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # Never more than one tile of scores at a time.
    assert stats.max_scores_held <= block_size ** 2
    if block_size < 37:
        assert stats.max_scores_held < stats.full_scores


@pytest.mark.parametrize("T,S", [(1, 40), (7, 40), (40, 40)])
def test_queries_after_a_cache(T, S):
    """Queries are the newest T positions, as in a decode step or a chunk after a cache."""
    q, k, v = qkv(T=T, S=S, seed=1)
    ref, _ = attention_by_hand(q, k, v, start=S - T)
    torch.testing.assert_close(tiled_attention.flash_attention(q, k, v, 8, start=S - T), ref, atol=1e-5, rtol=1e-5)


def test_queries_before_the_last_keys():
    """start = 0 with more keys than queries: the later keys are masked for every query."""
    q, k, v = qkv(T=10, S=30, seed=5)
    ref, _ = attention_by_hand(q, k, v, start=0)
    torch.testing.assert_close(tiled_attention.flash_attention(q, k, v, 4), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tiled_attention.flash_attention(q, k[..., :10, :], v[..., :10, :], 4), ref,
                               atol=1e-5, rtol=1e-5)


def test_not_causal_equals_sdpa():
    q, k, v = qkv(H=4, KV=4, T=20, S=33, seed=2)
    ref = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(tiled_attention.flash_attention(q, k, v, 7, causal=False), ref, atol=1e-5, rtol=1e-5)


def test_three_dimensional_inputs_and_dtype():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 30, 8, generator=g) for _ in range(3))        # (heads, T, d): no batch axis
    ref, _ = attention_by_hand(q[None], k[None], v[None])
    torch.testing.assert_close(tiled_attention.flash_attention(q, k, v, 4), ref[0], atol=1e-5, rtol=1e-5)
    qb, kb, vb = qkv(dtype=torch.bfloat16)
    out = tiled_attention.flash_attention(qb, kb, vb, 8)
    assert out.dtype == torch.bfloat16
    ref, _ = attention_by_hand(qb.float(), kb.float(), vb.float())            # fp32, as the tiles compute
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_causal_tiles_above_the_diagonal_are_skipped():
    q, k, v = qkv(T=64, S=64)
    _, stats = tiled_attention.flash_attention(q, k, v, 16, return_stats=True)
    # 4 x 4 tiles; the 6 strictly above the diagonal are never computed.
    assert (stats.tiles_computed, stats.tiles_skipped) == (10, 6)
    _, stats = tiled_attention.flash_attention(q, k, v, 16, causal=False, return_stats=True)
    assert (stats.tiles_computed, stats.tiles_skipped) == (16, 0)


def test_large_scores_do_not_overflow():
    q, k, v = qkv(T=24, seed=4)
    out = tiled_attention.flash_attention(q * 300, k, v, 5)       # scores in the thousands: exp would overflow
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, attention_by_hand(q * 300, k, v)[0], atol=1e-4, rtol=1e-4)


def test_online_softmax():
    x = torch.tensor([1.0, 3.0, -2.0, 5.0, 0.5, 5.0, -7.0])
    y, history = tiled_attention.online_softmax(x, 2)
    torch.testing.assert_close(y, x.softmax(0))
    maxima = [m for m, _ in history]
    assert len(history) == 4 and maxima == sorted(maxima) and maxima[-1] == 5.0
    # The last running sum is the softmax denominator relative to the max.
    assert history[-1][1] == pytest.approx(float(torch.exp(x - 5).sum()))


def test_bad_arguments():
    q, k, v = qkv(T=8, S=4)
    with pytest.raises(ValueError, match="block_size"):
        tiled_attention.flash_attention(q, k, v, 0)
    with pytest.raises(ValueError, match="start \\+ T = 8 > S = 4 keys"):
        tiled_attention.flash_attention(q, k, v, 4)
    q, k, v = qkv(T=4, S=8)
    with pytest.raises(ValueError, match="start \\+ T = 9 > S = 8 keys"):
        tiled_attention.flash_attention(q, k, v, 4, start=5)


def test_model_with_flash_attention_gives_the_same_answer(model):
    """The whole model attending with flash_attention (model.attention = "tiled")."""
    ids = labkit.encode(model, "The capital of France is").ids
    plain = model.forward(ids)
    with tiled_attention.in_model(model, block_size=2):
        assert (model.attention, model.tiled_block_size) == ("tiled", 2)
        tiled = model.forward(ids)
        gen = labkit.generate(model, ids, max_new_tokens=4)
    torch.testing.assert_close(tiled, plain, atol=2e-4, rtol=1e-4)
    assert gen.token_ids == labkit.generate(model, ids, max_new_tokens=4).token_ids
    assert (model.attention, model.tiled_block_size) == ("sdpa", 64)     # restored
