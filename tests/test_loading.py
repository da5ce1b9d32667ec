"""Loading: the bundled GGUF, the converted-model cache, local folders."""

import os
import subprocess
import sys
import time

import torch

import labkit


def test_default_model_shape(model):
    c = model.config
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size) == \
        (30, 576, 9, 3, 64, 49152)
    assert c.group_size == 3 and c.family == "llama"
    assert model.hf.lm_head.weight.data_ptr() == model.hf.model.embed_tokens.weight.data_ptr()  # tied


def test_gguf_located_through_metadata():
    path = labkit.default_gguf_file()
    assert path.suffix == ".gguf" and path.is_file() and path.stat().st_size > 50e6


def test_conversion_cache_is_used(tmp_path):
    """A fresh LABKIT_CACHE converts once; the second process loads the saved folder."""
    env = {**os.environ, "LABKIT_CACHE": str(tmp_path)}
    code = "import time,labkit; t=time.time(); m=labkit.load_model(progress=False); print(time.time()-t)"
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "converting" in first.stdout
    assert list(tmp_path.glob("models/*/model.safetensors"))
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "converting" not in second.stdout
    assert float(second.stdout.split()[-1]) < float(first.stdout.split()[-1])


def test_load_a_local_folder(tmp_path, model):
    from tiny_models import tiny_hf_model

    hf = tiny_hf_model("gpt2")
    hf.save_pretrained(tmp_path)
    model.tokenizer.save_pretrained(tmp_path)     # any tokenizer will do for loading
    loaded = labkit.load_model(str(tmp_path))
    assert loaded.config.model_type == "gpt2" and loaded.config.rope_theta is None
    ids = torch.arange(12)
    assert torch.allclose(loaded.forward(ids), hf(ids[None]).logits[0], atol=1e-4)


def test_same_model_object_is_reused(model):
    assert labkit.load_model(device="cpu", dtype="fp32") is model
