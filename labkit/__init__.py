"""labkit: the engine behind LLM Inference Lab.

    import labkit
    model = labkit.load_model()                              # SmolLM2-135M-Instruct, offline
    enc = labkit.encode(model, "The capital of France is")   # stage 1: enc.ids, enc.tokens
    cache = model.new_cache(max_len=1024)
    logits = model.forward(enc.ids, cache=cache)             # stage 2: (T, vocab); fills the cache
    token, probs = labkit.sample(logits[-1], method="top_p", temperature=0.8, top_p=0.9, seed=0)
    gen = labkit.generate(model, "The capital of France is", max_new_tokens=32)

Files, in the order data flows: models.py (load), encode.py (stage 1),
transformer.py (stage 2), kv_cache.py, sampling.py (stage 3), generate.py
(prefill + decode), trace.py (what a forward pass records); charts.py and
widgets.py draw it.
"""

from .encoding import (Encoding, embed, encode, format_chat, learned_positions, model_rope_angles,
                     normalize, rope_angles, sinusoidal_positions, token_strings)
from .generation import Decoder, Generation, Step, decode_one_token, generate, prefill, recompute
from .kv_cache import KVCache
from .loading import (DEFAULT_MODEL, ModelNotAvailableError, cache_dir, default_dtype, default_gguf_file,
                     load_model)
from .sampling import METHODS, SamplingParams, distribution, sample
from .trace import Trace, logit_lens
from .attention import attention_by_hand, causal_mask
from .model import SUPPORTED, Model, ModelConfig

__all__ = [
    "DEFAULT_MODEL", "Decoder", "Encoding", "Generation", "KVCache", "METHODS", "Model", "ModelConfig",
    "ModelNotAvailableError", "SUPPORTED", "SamplingParams", "Step", "Trace", "attention_by_hand", "cache_dir", "causal_mask",
    "decode_one_token", "default_dtype", "default_gguf_file", "distribution", "embed", "encode",
    "format_chat", "generate", "learned_positions", "load_model", "logit_lens", "model_rope_angles",
    "normalize", "prefill", "recompute", "rope_angles", "sample", "sinusoidal_positions", "token_strings",
]
