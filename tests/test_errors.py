"""Bad input gets a clear error naming the parameter and the allowed values."""

import pytest
import torch

import labkit
from tiny_models import tiny_hf_model


def test_empty_prompt(model):
    with pytest.raises(ValueError, match="empty"):
        labkit.encode(model, "")
    with pytest.raises(ValueError, match="empty"):
        labkit.generate(model, "")
    with pytest.raises(ValueError, match="non-empty"):
        model.forward([])


def test_prompt_longer_than_context():
    m = labkit.Model(tiny_hf_model("llama"))           # context: 256 positions
    with pytest.raises(ValueError, match="context"):
        m.forward(torch.zeros(300, dtype=torch.long))
    with pytest.raises(ValueError, match=r"max_new_tokens must be <= 56"):
        labkit.generate(m, torch.zeros(200, dtype=torch.long), max_new_tokens=100)


def test_negative_max_new_tokens(model):
    with pytest.raises(ValueError, match="max_new_tokens"):
        labkit.generate(model, "Hi", max_new_tokens=-1)


def test_sampling_errors_through_generate(model):
    with pytest.raises(ValueError, match="top_p must be in"):
        labkit.generate(model, "Hi", method="top_p", top_p=0)
    with pytest.raises(ValueError, match="temperature"):
        labkit.generate(model, "Hi", method="temperature", temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        labkit.generate(model, "Hi", method="top_k", top_k=0)


def test_token_ids_out_of_range(model):
    with pytest.raises(ValueError, match="token ids must be in"):
        model.forward([0, model.config.vocab_size])


def test_unknown_model_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(labkit.ModelNotAvailableError, match="offline") as e:
        labkit.load_model("gpt2")
    assert "Colab" in str(e.value) and "load_model()" in str(e.value)
    assert issubclass(labkit.ModelNotAvailableError, OSError)     # `except OSError` catches it, as for transformers
    with pytest.raises(labkit.ModelNotAvailableError, match="not found"):
        labkit.load_model("/no/such/model.gguf")


def test_unsupported_architecture():
    from transformers import BertConfig, BertForMaskedLM

    bert = BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, intermediate_size=64))
    with pytest.raises(ValueError, match="supported: llama, mistral, qwen2, gpt2"):
        labkit.Model(bert)


def test_unsupported_architecture_from_a_folder(tmp_path):
    from transformers import BertConfig

    BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'bert'"):
        labkit.load_model(str(tmp_path))


def test_decoding_past_the_cache(model):
    cache = model.new_cache(max_len=6)
    model.forward(labkit.encode(model, "The capital of France is").ids, cache=cache)
    model.forward([11], cache=cache)
    with pytest.raises(ValueError, match="max_len=6"):
        model.forward([12], cache=cache)
    assert cache.length == 6                            # the failed step wrote nothing


def test_cache_size_limits(model):
    with pytest.raises(ValueError, match="max_len must be in"):
        model.new_cache(max_len=0)
    with pytest.raises(ValueError, match="max_len must be in"):
        model.new_cache(max_len=model.config.max_len + 1)


def test_bad_dtype_and_device():
    with pytest.raises(ValueError, match="dtype must be"):
        labkit.load_model(dtype="int3")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            labkit.load_model(device="cuda")
