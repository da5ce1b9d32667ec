"""Stage 1: normalisation, chat template, readable tokens, embeddings, positions."""

import math

import pytest
import torch

import labkit


def test_normalize_full_width():
    assert labkit.normalize("ＡＢＣ１２３！？") == "ABC123!?"
    assert labkit.normalize("法国的首都是") == "法国的首都是"


def test_encode_ids_and_tokens(model):
    enc = labkit.encode(model, "The capital of France is")
    assert enc.tokens == ["The", " capital", " of", " France", " is"]
    assert enc.ids.tolist() == model.tokenizer("The capital of France is")["input_ids"]
    assert enc.table()[3] == (enc.ids[3].item(), " France")


def test_encode_keeps_the_models_own_tokenization_by_default(model):
    """Full-width Chinese punctuation reaches the model as typed: the same ids
    as the model's tokenizer. NFKC (opt-in) turns ？ into ? and changes them."""
    text = "法国的首都是哪里？"
    own = model.tokenizer(text)["input_ids"]
    assert labkit.encode(model, text).ids.tolist() == own
    nfkc = labkit.encode(model, text, normalize_text=True)
    assert nfkc.ids.tolist() == model.tokenizer("法国的首都是哪里?")["input_ids"]
    assert nfkc.ids.tolist() != own


def test_chinese_partial_bytes_are_shown_as_bytes(model):
    enc = labkit.encode(model, "法国的首都是")
    assert len(enc.tokens) == 10
    text = "".join(enc.tokens)
    assert "<0xE5>" in text and "æ" not in text and "ķ" not in text
    # Joining the bytes of every piece gives back the text exactly.
    raw = b"".join(labkit.encoding.piece_bytes(model.tokenizer, i) for i in enc.ids)
    assert raw.decode("utf-8") == "法国的首都是"
    whole = [t for t in enc.tokens if "<0x" not in t]
    assert set(whole) <= set("法国的首都是")


def test_chat_template_with_system_and_turns(model):
    messages = [{"role": "user", "content": "What color is the sky?"},
                {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": "And at night？"}]
    enc = labkit.encode(model, messages, system="You are a concise assistant.")
    assert enc.text.index("You are a concise assistant.") < enc.text.index("What color is the sky?")
    assert enc.text.index("Blue.") < enc.text.index("And at night？")  # kept as typed
    normalised = labkit.encode(model, messages, system="You are a concise assistant.", normalize_text=True)
    assert "And at night?" in normalised.text and "？" not in normalised.text
    assert enc.text.rstrip().endswith("assistant")                      # generation prompt
    assert enc.tokens.count("<|im_start|>") == 5      # system, 3 turns, the reply


def test_embedding_lookup_is_a_row_of_the_matrix(model):
    enc = labkit.encode(model, "The capital of France is")
    vectors = labkit.embed(model, enc.ids)
    assert vectors.shape == (5, model.config.d_model)
    assert torch.equal(vectors[3], model.hf.get_input_embeddings().weight[enc.ids[3]])


def test_sinusoidal_positions_formula():
    pe = labkit.sinusoidal_positions(50, 16)
    p, i = 7, 3
    assert math.isclose(pe[p, 2 * i].item(), math.sin(p / 10000 ** (2 * i / 16)), abs_tol=1e-6)
    assert math.isclose(pe[p, 2 * i + 1].item(), math.cos(p / 10000 ** (2 * i / 16)), abs_tol=1e-6)
    assert torch.equal(pe[0, 1::2], torch.ones(8))


def test_rope_angles_match_the_model(model):
    c = model.config
    ours = labkit.rope_angles(torch.arange(10), c.head_dim, c.rope_theta)
    assert torch.allclose(ours, labkit.model_rope_angles(model, torch.arange(10)), rtol=1e-5)
    assert torch.allclose(ours[3], 3 * ours[1])          # angle grows linearly with position


def test_learned_positions_need_gpt2(model):
    with pytest.raises(ValueError, match="RoPE"):
        labkit.learned_positions(model, 4)


def test_sentencepiece_style_pieces():
    class Fake:
        all_special_ids = []
        def convert_ids_to_tokens(self, i):
            return ["▁The", "<0xE6>", "cat"][i]
    assert labkit.token_strings(Fake(), [0, 1, 2]) == [" The", "<0xE6>", "cat"]
