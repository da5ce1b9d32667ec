"""Randomly initialised tiny transformers models, built in the test (no download)."""

import torch


def tiny_hf_model(kind: str, seed: int = 0):
    """A randomly initialised tiny transformers model of one family (no download)."""
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                              Qwen2Config, Qwen2ForCausalLM)

    torch.manual_seed(seed)
    common = dict(vocab_size=211, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256)
    if kind == "llama":
        hf = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=False))
    elif kind == "qwen2":
        hf = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True))
    elif kind == "llama_mha":
        hf = LlamaForCausalLM(LlamaConfig(**{**common, "num_key_value_heads": 8}))
    elif kind == "gpt2":
        hf = GPT2LMHeadModel(GPT2Config(vocab_size=211, n_embd=64, n_layer=3, n_head=4, n_positions=256))
    else:
        raise ValueError(kind)
    return hf.eval()
