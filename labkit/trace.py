"""What a forward pass can record: attention probabilities, hidden states, timings.

Recording is opt-in (`model.forward(ids, record=True)`) and free when off:
the fast path keeps nothing. Recorded tensors are named the way
TransformerLens names them, so `trace["blocks.3.attn.pattern"]` is the
attention probabilities of layer 3.

Shapes, for an input of T tokens (a leading batch axis when the input had one):
    trace.attentions[layer]   (heads, T, keys)   keys = cached + T
    trace.hidden[0]           (T, d_model)       the embeddings
    trace.hidden[layer + 1]   (T, d_model)       the residual stream after that block
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Trace:
    attentions: list[torch.Tensor] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)
    layer_seconds: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def finish(self, batched: bool) -> None:
        """Drop the batch axis of an unbatched input, so shapes read as above."""
        if not batched:
            self.attentions = [a[0] for a in self.attentions]
            self.hidden = [h[0] for h in self.hidden]

    def names(self) -> list[str]:
        out = ["embed"]
        for i in range(len(self.attentions)):
            out += [f"blocks.{i}.attn.pattern", f"blocks.{i}.out"]
        return out

    def __getitem__(self, name: str) -> torch.Tensor:
        if name == "embed":
            return self.hidden[0]
        parts = name.split(".")
        if len(parts) >= 3 and parts[0] == "blocks" and parts[1].isdigit():
            i, rest = int(parts[1]), ".".join(parts[2:])
            if rest == "attn.pattern":
                return self.attentions[i]
            if rest == "out":
                return self.hidden[i + 1]
        raise KeyError(f"{name!r}; recorded names look like: {', '.join(self.names()[:3])}, ...")


@torch.inference_mode()
def logit_lens(model, trace: Trace, k: int = 1):
    """What each layer would predict if the model stopped there: the final norm
    and LM head applied to every recorded hidden state.

    Returns (top_ids, top_probs), each (layers + 1, T, k); row 0 is the embeddings.
    """
    hidden = torch.stack(trace.hidden)                 # (L+1, T, d)
    probs = model.unembed(hidden).float().softmax(-1)  # (L+1, T, vocab)
    top = probs.topk(k, dim=-1)
    return top.indices, top.values
