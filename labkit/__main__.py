"""Command line: python -m labkit "The capital of France is"

Streams the continuation, then prints TTFT, TPOT, tokens/s and the KV cache size.
"""

from __future__ import annotations

import argparse
import sys

from .generation import generate
from .loading import load_model
from .sampling import METHODS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit", description=__doc__.splitlines()[0])
    p.add_argument("prompt", help="the text to continue")
    p.add_argument("--model", default=None, help="hub id, folder or .gguf file (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--method", default="greedy", choices=METHODS + ("beam",))
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--chat", action="store_true", help="apply the chat template")
    p.add_argument("--system", default=None, help="system prompt (implies --chat)")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole sequence every step")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, help="fp32, bf16 or fp16")
    a = p.parse_args(argv)
    try:
        model = load_model(a.model, device=a.device, dtype=a.dtype)
        print(a.prompt, end="", flush=True)
        gen = generate(model, a.prompt, a.max_new_tokens, a.method, temperature=a.temperature,
                       top_k=a.top_k, top_p=a.top_p, seed=a.seed, chat=a.chat, system=a.system,
                       use_cache=not a.no_cache,
                       on_token=lambda piece, step: print(piece, end="", flush=True))
    except (ValueError, RuntimeError, OSError) as e:      # OSError: a model that cannot be found
        print(f"\nerror: {e}", file=sys.stderr)
        return 2
    print()
    cache = f"{gen.cache.nbytes / 1e6:.2f} MB ({gen.cache.length} positions)" if gen.cache else "none"
    print(f"[{model.name} on {model.device}, {model.dtype}] {len(gen.token_ids)} tokens, "
          f"finish: {gen.finish_reason}; TTFT {gen.ttft_s * 1e3:.1f} ms, TPOT {gen.tpot_s * 1e3:.1f} ms, "
          f"{gen.tokens_per_s:.1f} tokens/s, KV cache {cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
