"""Stage 1, encode: text -> token ids -> vectors.

    [optional: normalise (NFKC: full-width -> half-width)]  ->  chat template
    (system prompt, joined turns)  ->  tokenize (ids, readable pieces)  ->
    embedding lookup  ->  positional information.

Normalising is off by default: a serving engine feeds the model its own
tokenizer's ids for the text as typed, and the model was trained on
full-width Chinese punctuation (，。？), which NFKC would turn into ASCII
(other ids, another prompt). `normalize_text=True` shows what it changes.

Readable pieces: byte-level BPE vocabularies (GPT-2, SmolLM, Qwen) store each
piece as bytes spelled with printable stand-in characters ("Ġ" for a space).
`token_strings` turns them back into text, and shows a piece that is only part
of a UTF-8 character as its bytes instead of mojibake (`æ`). It writes them
`<0xE6>`, the notation SentencePiece uses for its byte-fallback tokens: that
is labkit's display form only, not an entry of a byte-level BPE vocabulary
(there the byte is the stand-in character itself).

Positions: the sinusoidal encoding of the original Transformer (Vaswani et
al. 2017), the learned position vectors of GPT-2, and the RoPE rotation
angles (Su et al. 2021) of Llama-style models.

Left out: tokenizer training (see minbpe), and tokenizers that are neither
byte-level BPE nor SentencePiece-style (their pieces are shown as decoded).
"""

from __future__ import annotations

import codecs
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

import torch

Message = dict  # {"role": "system" | "user" | "assistant", "content": str}


@dataclass
class Encoding:
    text: str            # the exact string that was tokenized (after template)
    ids: torch.Tensor    # (T,) token ids, on the CPU
    tokens: list[str]    # readable piece of each id

    def __len__(self) -> int:
        return len(self.tokens)

    def table(self) -> list[tuple[int, str]]:
        """(Token ID, Token Text) rows, as in the course notes."""
        return list(zip(self.ids.tolist(), self.tokens))


def normalize(text: str) -> str:
    """NFKC normalisation: full-width letters, digits and punctuation become
    their half-width forms ("ＡＢＣ１２３！" -> "ABC123!"), ligatures split."""
    return unicodedata.normalize("NFKC", text)


def format_chat(model, messages: list[Message] | str, system: str | None = None,
                add_generation_prompt: bool = True) -> str:
    """Join a conversation into the single string the model was trained on.

    messages: a list of {"role", "content"} turns, or one user message.
    system: a system prompt ("meta instruction") put first.
    Uses the tokenizer's chat template; models without one (GPT-2) get a
    plain "Role: content" transcript.
    """
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    messages = list(messages)
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError("messages must be dicts with 'role' and 'content', e.g. "
                             "{'role': 'user', 'content': 'Hi'}")
    if system is not None:
        messages = [{"role": "system", "content": system}] + [m for m in messages if m["role"] != "system"]
    tok = model.tokenizer
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template(messages, tokenize=False,
                                       add_generation_prompt=add_generation_prompt)
    text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages)
    return text + ("Assistant:" if add_generation_prompt else "")


def encode(model, text: str | list[Message], *, chat: bool = False, system: str | None = None,
           normalize_text: bool = False, add_special_tokens: bool = True) -> Encoding:
    """Tokenize a prompt.

    text: a prompt, or a conversation (a list of {"role", "content"} turns).
    chat: apply the chat template (implied by a conversation or a system prompt).
    normalize_text: apply NFKC normalisation first (off by default: the model's
        own tokenizer sees the text as typed, full-width punctuation included).
    """
    if isinstance(text, str):
        if not text:
            raise ValueError("text (the prompt) is empty; give at least one character")
        if normalize_text:
            text = normalize(text)
    elif isinstance(text, (list, tuple)):
        if not text:
            raise ValueError("text (the conversation) has no messages")
        if normalize_text:
            text = [{**m, "content": normalize(m.get("content", ""))} for m in text]
        chat = True
    else:
        raise ValueError(f"text must be a string or a list of messages, got {type(text).__name__}")
    if chat or system is not None:
        text = format_chat(model, text, system=system)
        add_special_tokens = False  # the template already wrote them
    ids = model.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
    ids = torch.tensor(ids, dtype=torch.long)
    return Encoding(text, ids, token_strings(model.tokenizer, ids))


# ----------------------------------------------------------------------------
# Readable token pieces
# ----------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's table from stand-in characters back to bytes. Byte-level BPE
    spells every byte as a printable character: the 188 printable ones as
    themselves, the others (space, control bytes, 127-160, 173) as 256 + n."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


def _hex_bytes(err: UnicodeDecodeError):
    bad = err.object[err.start:err.end]
    return "".join(f"<0x{b:02X}>" for b in bad), err.end


codecs.register_error("labkit_hex", _hex_bytes)


def _is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return type(decoder).__name__ == "ByteLevel" or "ByteLevel" in repr(decoder)


def piece_bytes(tokenizer, token_id: int) -> bytes | None:
    """The raw bytes of one piece, when the vocabulary is byte-level (else None)."""
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    table = _byte_decoder()
    if piece is None or not all(ch in table for ch in piece):
        return None
    return bytes(table[ch] for ch in piece)


def token_strings(tokenizer, ids) -> list[str]:
    """A readable string for each id: decoded text, a special token as itself,
    and bytes that are only part of a UTF-8 character as <0xE6>."""
    ids = [int(i) for i in ids]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    byte_level = _is_byte_level(tokenizer)
    out = []
    for i in ids:
        piece = tokenizer.convert_ids_to_tokens(i)
        raw = piece_bytes(tokenizer, i) if byte_level and i not in special else None
        if raw is not None:
            out.append(raw.decode("utf-8", errors="labkit_hex"))
        elif piece is not None and piece.startswith("<0x") and piece.endswith(">"):
            out.append(piece)                     # SentencePiece byte fallback, already <0xE6>
        elif piece is not None:
            out.append(piece.replace("▁", " "))   # SentencePiece marks a space with ▁
        else:
            out.append(tokenizer.decode([i]))
    return out


# ----------------------------------------------------------------------------
# Embeddings and positions
# ----------------------------------------------------------------------------

@torch.inference_mode()
def embed(model, ids) -> torch.Tensor:
    """Embedding lookup: row `id` of the embedding matrix for each id. (T, d_model)"""
    ids = torch.as_tensor(ids, dtype=torch.long, device=model.device)
    return model.hf.get_input_embeddings()(ids)


def sinusoidal_positions(n_positions: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The original Transformer's encoding (Vaswani et al. 2017), (n_positions, d_model):
    PE[p, 2i] = sin(p / base^(2i/d)),  PE[p, 2i+1] = cos(p / base^(2i/d))."""
    if n_positions < 1 or d_model < 2 or d_model % 2:
        raise ValueError(f"need n_positions >= 1 and an even d_model >= 2, got {n_positions}, {d_model}")
    p = torch.arange(n_positions, dtype=torch.float32)[:, None]
    freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    pe = torch.zeros(n_positions, d_model)
    pe[:, 0::2] = torch.sin(p * freq)
    pe[:, 1::2] = torch.cos(p * freq)
    return pe


def rope_angles(positions, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """RoPE: the angle (radians) by which each pair of a head's dimensions is
    rotated at each position, (len(positions), head_dim / 2). Pair i turns at
    frequency theta^(-2i/head_dim): the first pairs spin fast, the last slowly.

    theta: 10,000 in RoFormer and Llama 1/2; models choose their own
    (SmolLM2-135M: 100,000; see model_rope_angles). Which two dimensions form
    pair i is a separate convention: (i, i + head_dim/2) in Hugging Face's
    code, as labkit.model uses, (2i, 2i + 1) in RoFormer and Meta's code."""
    positions = torch.as_tensor(positions, dtype=torch.float32)
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    return positions[:, None] * inv_freq[None, :]


def model_rope_angles(model, positions) -> torch.Tensor:
    """The rotation angles the loaded model itself uses (its own frequencies)."""
    if model.config.family != "llama":
        raise ValueError(f"{model.config.model_type} has no rotary embedding; use learned_positions")
    positions = torch.as_tensor(positions, dtype=torch.float32)
    return positions[:, None] * model.inv_freq.cpu()[None, :]


@torch.inference_mode()
def learned_positions(model, n_positions: int) -> torch.Tensor:
    """GPT-2's learned position vectors, one row per position (n_positions, d_model)."""
    if model.config.family != "gpt2":
        raise ValueError(f"{model.config.model_type} has no learned position table; it uses RoPE "
                         "(see model_rope_angles)")
    return model.hf.transformer.wpe.weight[:n_positions]
