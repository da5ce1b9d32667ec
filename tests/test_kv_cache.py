"""The KV cache on its own, against a reference kept by hand (plain Python lists).

Every expected byte count is written out from the shapes in the test, never
read from the cache under test.
"""

import pytest
import torch

from labkit import KVCache

LAYERS, BATCH, KV_HEADS, HEAD, MAX_LEN = 3, 2, 4, 8, 10


def new_cache(**kwargs):
    args = dict(batch_size=BATCH) | kwargs
    return KVCache(LAYERS, KV_HEADS, HEAD, MAX_LEN, **args)


def block(seed, T, batch=BATCH):
    """Keys or values for T positions: (batch, kv_heads, T, head)."""
    return torch.randn(batch, KV_HEADS, T, HEAD, generator=torch.Generator().manual_seed(seed))


def test_update_returns_everything_written_so_far():
    cache = new_cache()
    written = {layer: ([], []) for layer in range(LAYERS)}   # the reference: what went in, in order
    pos = 0
    for step, T in enumerate([4, 1, 1, 3]):                  # a prefill, two decode steps, a chunk
        for layer in range(LAYERS):
            k, v = block(100 * step + layer, T), block(1000 + 100 * step + layer, T)
            written[layer][0].append(k)
            written[layer][1].append(v)
            keys, values = cache.update(layer, pos, k, v)
            assert keys.shape == (BATCH, KV_HEADS, pos + T, HEAD)
            assert torch.equal(keys, torch.cat(written[layer][0], dim=2))
            assert torch.equal(values, torch.cat(written[layer][1], dim=2))
        pos += T
        cache.length = pos
    # Layers do not share storage: layer 0's keys are not layer 1's.
    assert not torch.equal(cache.update(0, pos, block(7, 1), block(8, 1))[0][..., :pos, :],
                           torch.cat(written[1][0], dim=2))


def test_update_can_fill_the_cache_exactly_but_not_past_it():
    cache = new_cache()
    keys, _ = cache.update(0, MAX_LEN - 2, block(1, 2), block(2, 2))   # positions 8, 9: the last two
    assert keys.shape[2] == MAX_LEN
    with pytest.raises(ValueError, match=rf"positions 9\.\.10 but max_len={MAX_LEN}"):
        cache.update(0, MAX_LEN - 1, block(1, 2), block(2, 2))         # position 10 does not exist


def test_check_room_boundaries():
    cache = new_cache()
    cache.check_room(MAX_LEN)                      # an empty cache takes max_len positions
    with pytest.raises(ValueError, match="full"):
        cache.check_room(MAX_LEN + 1)
    cache.length = 7
    cache.check_room(3)
    with pytest.raises(ValueError, match="holds 7"):
        cache.check_room(4)


def test_reset_and_truncate():
    cache = new_cache()
    cache.length = 6
    cache.truncate(6)                              # keeping everything is allowed
    assert cache.length == 6
    cache.truncate(2)
    assert cache.length == 2
    cache.truncate(0)
    assert cache.length == 0
    cache.length = 5
    for bad in (-1, 6):
        with pytest.raises(ValueError, match=r"\[0, 5\]"):
            cache.truncate(bad)
    assert cache.length == 5                       # a refused truncate changes nothing
    cache.reset()
    assert cache.length == 0 and cache.max_len == MAX_LEN


def test_reorder_follows_the_index_rows_may_repeat():
    cache = KVCache(LAYERS, KV_HEADS, HEAD, MAX_LEN, batch_size=3)
    k, v = block(1, 4, batch=3), block(2, 4, batch=3)
    for layer in range(LAYERS):
        cache.update(layer, 0, k + layer, v - layer)
    cache.length = 4
    index = [2, 2, 0]                              # beam search: beam 2 kept twice, beam 0 once
    cache.reorder(torch.tensor(index))
    for layer in range(LAYERS):
        keys, values = cache.update(layer, 4, block(3, 1, batch=3), block(4, 1, batch=3))
        for row, source in enumerate(index):
            assert torch.equal(keys[row, :, :4], k[source] + layer)
            assert torch.equal(values[row, :, :4], v[source] - layer)
    assert cache.batch_size == 3 and cache.length == 4


@pytest.mark.parametrize("dtype, value_bytes", [(torch.float32, 4), (torch.bfloat16, 2), (torch.float16, 2)])
def test_bytes(dtype, value_bytes):
    cache = new_cache(dtype=dtype)
    per_token = 2 * LAYERS * BATCH * KV_HEADS * HEAD * value_bytes     # K and V, every layer and row
    assert cache.bytes_per_token == per_token
    assert cache.nbytes == 0
    cache.length = 3
    assert cache.nbytes == 3 * per_token
    assert cache.allocated_nbytes == MAX_LEN * per_token
    assert (cache.n_layers, cache.batch_size) == (LAYERS, BATCH)
    assert cache.k.dtype == cache.v.dtype == dtype


def test_default_model_cache_bytes(model):
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 values; fp32 -> 2 x 30 x 3 x 64 x 4 bytes.
    cache = model.new_cache(max_len=16)
    assert cache.bytes_per_token == 46_080
    assert cache.allocated_nbytes == 16 * 46_080


@pytest.mark.parametrize("kwargs, name", [({"max_len": 0}, "max_len"), ({"batch_size": 0}, "batch_size")])
def test_bad_sizes_name_themselves(kwargs, name):
    args = dict(max_len=MAX_LEN, batch_size=1) | kwargs
    with pytest.raises(ValueError, match=name):
        KVCache(LAYERS, KV_HEADS, HEAD, **args)


def test_smallest_sizes_are_allowed():
    cache = KVCache(1, 1, 2, 1, batch_size=1)
    keys, _ = cache.update(0, 0, torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2))
    assert keys.shape == (1, 1, 1, 2)


def test_defaults_one_row_fp32_on_the_cpu():
    cache = KVCache(LAYERS, KV_HEADS, HEAD, MAX_LEN)
    assert cache.batch_size == 1 and cache.k.dtype == torch.float32 and cache.k.device.type == "cpu"


def test_storage_is_on_the_device_asked_for():
    cache = KVCache(LAYERS, KV_HEADS, HEAD, MAX_LEN, device="meta")    # "meta": shapes only, no memory
    assert cache.k.device.type == cache.v.device.type == "meta"


def test_repr_says_how_full():
    # 1000 positions of 2 x 2 layers x 1 row x 2 heads x 125 values x 4 bytes = 4 kB a token.
    cache = KVCache(2, 2, 125, 1000)
    cache.length = 250
    text = repr(cache)
    assert "length=250/1000" in text
    assert "layers=2" in text and "kv_heads=2" in text and "head_size=125" in text
    assert "1.00 MB used of 4.00 MB" in text
