"""The captured decode step (labkit.fast) against the eager path, and the byte traps.

GraphDecoder runs one code structure on every device: static token and
position buffers, K/V written with index_copy_, attention over a bucket of
cache slots with the unused ones masked. On the CPU the step runs eagerly;
on CUDA it is replayed from captured graphs. Both must give the eager path's
greedy tokens.
"""

import pytest
import torch
import torch.nn.functional as F

import labkit
import labkit.transformer as transformer
from tiny_models import tiny_hf_model
from labkit.fast import GraphDecoder


def eager_greedy(model, ids, n):
    """Greedy tokens from the eager path: labkit.prefill, then labkit.decode_one_token."""
    ids = ids.to(model.device)
    cache = model.new_cache(max_len=len(ids) + n)
    logits, _ = labkit.prefill(model, ids, cache)
    tokens = [int(logits.argmax())]
    for _ in range(n - 1):
        logits, _ = labkit.decode_one_token(model, torch.tensor([tokens[-1]], device=model.device), cache)
        tokens.append(int(logits.argmax()))
    return tokens


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2", "llama_mha"])
def test_static_step_equals_eager_on_tiny_models(kind):
    m = labkit.Model(tiny_hf_model(kind))
    ids = torch.randint(0, 211, (11,), generator=torch.Generator().manual_seed(3))
    # bucket=8 makes the 20 decode steps cross two bucket boundaries (16, 24, 32 slots).
    dec = GraphDecoder(m, max_len=40, bucket=8)
    assert not dec.use_graphs
    run = dec.greedy(ids, 20, warmup=False)
    assert run.token_ids == eager_greedy(m, ids, 20)
    assert dec.cache.length == 11 + 19
    # The step's logits equal a full forward's, not just the argmax.
    full = m.forward(torch.cat([ids, torch.tensor(run.token_ids[:-1])]))[-1]
    dec.prefill(torch.cat([ids, torch.tensor(run.token_ids[:-2])]))
    last = dec.step(run.token_ids[-2])
    assert (last - full).abs().max() <= 1e-4


def test_static_step_equals_eager_on_default_model(model):
    ids = labkit.encode(model, "The capital of France is").ids
    dec = GraphDecoder(model, max_len=64, bucket=16)
    run = dec.greedy(ids, 16, warmup=False)
    assert run.token_ids == eager_greedy(model, ids, 16)
    assert len(run.step_seconds) == 15 and run.ttft_s > 0


def test_buckets():
    m = labkit.Model(tiny_hf_model("llama"))
    dec = GraphDecoder(m, max_len=100, bucket=32)
    assert [dec.n_keys(p) for p in (0, 31, 32, 63, 64, 99)] == [32, 32, 64, 64, 96, 100]


def test_graphs_need_cuda():
    m = labkit.Model(tiny_hf_model("llama"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError):
            GraphDecoder(m, max_len=16, use_graphs=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_tokens_equal_eager():
    m = labkit.Model(tiny_hf_model("llama").cuda())
    ids = torch.randint(0, 211, (11,), generator=torch.Generator().manual_seed(3))
    dec = GraphDecoder(m, max_len=40, bucket=8)
    assert dec.use_graphs
    run = dec.greedy(ids, 20)
    assert run.token_ids == eager_greedy(m, ids, 20)
    assert dec.captures == 3          # buckets of 16, 24 and 32 slots


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_default_model():
    m = labkit.load_model(device="cuda", dtype=torch.float32)
    ids = labkit.encode(m, "The capital of France is").ids
    run = GraphDecoder(m, max_len=64).greedy(ids, 16)
    assert run.token_ids == eager_greedy(m, ids, 16)


# ----------------------------------------------------------------------------
# Byte traps: a decode step must read only the used part of the cache, and
# grouped-query attention must not copy K and V once per query head.
# ----------------------------------------------------------------------------

def spy_sdpa(monkeypatch, module):
    shapes = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        shapes.append((tuple(q.shape), tuple(k.shape)))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(module.F, "scaled_dot_product_attention", spy)
    return shapes


def test_decode_reads_only_the_used_cache(monkeypatch):
    m = labkit.Model(tiny_hf_model("llama"))           # 8 query heads, 2 KV heads
    cache = m.new_cache(max_len=200)
    m.forward(torch.arange(10), cache=cache)
    shapes = spy_sdpa(monkeypatch, transformer)
    m.forward(torch.tensor([5]), cache=cache)
    assert len(shapes) == m.config.n_layers
    q_shape, k_shape = shapes[0]
    assert k_shape == (1, 2, 11, 8)                     # 11 used positions of 200, 2 KV heads: no repeat
    assert q_shape == (1, 2, 4, 8)                      # the 4 query heads of a group share a KV head


def test_static_step_reads_one_bucket(monkeypatch):
    import labkit.fast as fast

    m = labkit.Model(tiny_hf_model("llama"))
    dec = GraphDecoder(m, max_len=200, bucket=16)
    dec.prefill(torch.arange(10))
    shapes = spy_sdpa(monkeypatch, fast)
    dec.step(5)
    assert shapes[0][1] == (1, 2, 16, 8)                # one bucket of 16 slots of 200, KV not repeated


def test_no_repeated_kv_in_decode():
    m = labkit.Model(tiny_hf_model("llama"))
    cache = m.new_cache(max_len=64)
    m.forward(torch.arange(20), cache=cache)
    with torch.profiler.profile() as prof:
        m.forward(torch.tensor([3]), cache=cache)
    ops = {e.key for e in prof.key_averages()}
    assert not ops & {"aten::repeat_interleave", "aten::repeat", "aten::expand_copy"}, ops
