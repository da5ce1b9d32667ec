"""What a forward pass can record: attention probabilities, hidden states, timings.

Recording is opt-in and free when off: pass a Trace and the forward pass
records into it,

    trace = labkit.Trace()
    logits = model.forward(ids, trace=trace)
    trace["blocks.3.attn.hook_pattern"]     # layer 3's attention probabilities

and without one nothing is kept. Recording attends by hand (labkit.attention),
the one implementation that keeps the probabilities.

Names are TransformerLens's hook names, for the three things recorded:

    hook_embed                    the residual stream entering block 0: token embeddings
                                  (+ GPT-2's learned positions, which TransformerLens keeps
                                  apart as hook_pos_embed)
    blocks.{i}.attn.hook_pattern  block i's attention probabilities (heads, queries, keys)
    blocks.{i}.hook_resid_post    the residual stream after block i

Shapes, for an input of T tokens (with a leading batch axis when the input
had one; TransformerLens always has it):
    trace.attentions[layer]   (heads, T, keys)   keys = cached + T
    trace.hidden[0]           (T, d_model)       hook_embed
    trace.hidden[layer + 1]   (T, d_model)       blocks.{layer}.hook_resid_post

Left out: TransformerLens's other hooks (queries, keys, values, scores, the
MLP's activations, each norm) and hooks that change activations as they run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Trace:
    attentions: list[torch.Tensor] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)
    layer_seconds: list[float] = field(default_factory=list)   # time spent in each block
    seconds: float = 0.0                                        # the whole forward pass

    def clear(self) -> None:
        """Forget a previous recording (forward calls this before recording)."""
        self.attentions, self.hidden, self.layer_seconds, self.seconds = [], [], [], 0.0

    def finish(self, batched: bool) -> None:
        """Drop the batch axis of an unbatched input, so shapes read as above."""
        if not batched:
            self.attentions = [a[0] for a in self.attentions]
            self.hidden = [h[0] for h in self.hidden]

    def names(self) -> list[str]:
        out = ["hook_embed"]
        for i in range(len(self.attentions)):
            out += [f"blocks.{i}.attn.hook_pattern", f"blocks.{i}.hook_resid_post"]
        return out

    def __getitem__(self, name: str) -> torch.Tensor:
        if name == "hook_embed":
            return self.hidden[0]
        parts = name.split(".")
        if len(parts) >= 3 and parts[0] == "blocks" and parts[1].isdigit():
            i, rest = int(parts[1]), ".".join(parts[2:])
            if rest == "attn.hook_pattern" and i < len(self.attentions):
                return self.attentions[i]
            if rest == "hook_resid_post" and i + 1 < len(self.hidden):
                return self.hidden[i + 1]
        raise KeyError(f"{name!r}; recorded names look like: {', '.join(self.names()[:3])}, ...")


@torch.inference_mode()
def logit_lens(model, trace: Trace, k: int = 1):
    """What each layer would predict if the model stopped there: the final norm
    and LM head applied to every recorded hidden state (the "logit lens",
    nostalgebraist 2020). Early layers were not trained to be read this way,
    so their guesses are a rough view, not what the model "thinks".

    Returns (top_ids, top_probs), each (layers + 1, T, k); row 0 is the embeddings.
    """
    hidden = torch.stack(trace.hidden)                 # (L+1, T, d)
    probs = model.unembed(hidden).float().softmax(-1)  # (L+1, T, vocab)
    top = probs.topk(k, dim=-1)
    return top.indices, top.values
