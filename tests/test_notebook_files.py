"""Checks on the notebook files themselves (not on what they compute).

Every notebook in notebooks/ is a jupytext pair: NN_name.py (percent format,
what is reviewed in git) and NN_name.ipynb (what Jupyter, Binder, Colab and
nbval open). These tests check that

- each .py has its .ipynb twin and each .ipynb its .py twin;
- the twins hold the same cells (type and source);
- each .ipynb names the `python3` kernel;
- no .ipynb stores outputs or execution counts (CI runs the notebooks, so
  stored outputs could only be stale), and none stores an error.

`make sync` (scripts/sync_notebooks.sh) fixes all of these. Running the
notebooks is nbval's job (`make test` hands it notebooks/*.ipynb).

The self-tests at the end build small pairs in a temporary folder, one of them
deliberately out of sync, to show that the checks can fail.
"""

from __future__ import annotations

from pathlib import Path

import jupytext
import nbformat
import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"


# --- the checks (plain functions: each returns a list of problems) -----------


def notebook_stems(folder: Path) -> list[str]:
    """Names of the notebooks in `folder`: stems of *.py and *.ipynb files.

    Files starting with "_" or "." are not notebooks.
    """
    if not folder.is_dir():
        return []
    names = {p.stem for p in folder.iterdir() if p.suffix in (".py", ".ipynb") and p.name[0] not in "_."}
    return sorted(names)


def twin_problems(folder: Path, stem: str) -> list[str]:
    """A notebook whose .py or .ipynb twin is missing."""
    py, ipynb = folder / f"{stem}.py", folder / f"{stem}.ipynb"
    problems = []
    if not ipynb.exists():
        problems.append(f"{stem}: {py.name} has no {ipynb.name} twin (run `make sync`)")
    if not py.exists():
        problems.append(f"{stem}: {ipynb.name} has no {py.name} twin (run `make sync`)")
    return problems


def _normalise(source: str) -> str:
    # Trailing spaces and trailing blank lines carry no meaning.
    return "\n".join(line.rstrip() for line in source.strip("\n").splitlines())


def _first_line_difference(a: str, b: str) -> str:
    """Where two cell sources first differ: 1-based line number and both lines."""
    lines_a, lines_b = a.splitlines(), b.splitlines()
    for n, (x, y) in enumerate(zip(lines_a, lines_b), start=1):
        if x != y:
            return f"line {n}: {x!r} vs {y!r}"
    n = min(len(lines_a), len(lines_b)) + 1
    extra_a = lines_a[n - 1] if len(lines_a) >= n else "<end of cell>"
    extra_b = lines_b[n - 1] if len(lines_b) >= n else "<end of cell>"
    return f"line {n}: {extra_a!r} vs {extra_b!r}"


def sync_problems(py: Path, ipynb: Path) -> list[str]:
    """Compare the cells of a pair, as jupytext reads them.

    Returns at most one problem: the first cell (0-based index) whose type or
    source differs, or a difference in the number of cells.
    """
    name = py.stem
    text_cells = jupytext.read(py).cells
    nb_cells = jupytext.read(ipynb).cells
    for i, (a, b) in enumerate(zip(text_cells, nb_cells)):
        if a.cell_type != b.cell_type:
            return [
                f"{name}: out of sync at cell {i}: {py.name} has a {a.cell_type} cell, "
                f"{ipynb.name} a {b.cell_type} cell (run `make sync`)"
            ]
        if _normalise(a.source) != _normalise(b.source):
            return [
                f"{name}: out of sync at cell {i} ({a.cell_type}), "
                f"{_first_line_difference(_normalise(a.source), _normalise(b.source))} "
                f"({py.name} vs {ipynb.name}; run `make sync`)"
            ]
    if len(text_cells) != len(nb_cells):
        return [
            f"{name}: out of sync: {py.name} has {len(text_cells)} cells, "
            f"{ipynb.name} has {len(nb_cells)} (first extra cell: {min(len(text_cells), len(nb_cells))}; "
            f"run `make sync`)"
        ]
    return []


def kernel_problems(ipynb: Path) -> list[str]:
    """The notebook must name the python3 kernel (nbval, Binder and Colab use it)."""
    nb = nbformat.read(ipynb, as_version=4)
    kernelspec = nb.metadata.get("kernelspec") or {}
    if kernelspec.get("name") != "python3":
        return [f"{ipynb.stem}: kernelspec name is {kernelspec.get('name')!r}, expected 'python3' (run `make sync`)"]
    return []


def output_problems(ipynb: Path) -> list[str]:
    """Stored outputs, execution counts or errors (first few, by cell index)."""
    nb = nbformat.read(ipynb, as_version=4)
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            problems.append(f"{ipynb.stem}: cell {i} stores an error output: {errors[0].get('ename')}")
        elif cell.get("outputs"):
            problems.append(f"{ipynb.stem}: cell {i} stores {len(cell.outputs)} output(s) (run `make sync`)")
        if cell.get("execution_count") is not None:
            problems.append(f"{ipynb.stem}: cell {i} stores execution_count {cell.execution_count} (run `make sync`)")
    if "widgets" in nb.metadata:
        problems.append(f"{ipynb.stem}: notebook metadata stores widget state (run `make sync`)")
    return problems[:5]


def all_problems(folder: Path, stem: str) -> list[str]:
    """Every check above, for one notebook."""
    problems = twin_problems(folder, stem)
    if problems:
        return problems
    py, ipynb = folder / f"{stem}.py", folder / f"{stem}.ipynb"
    return sync_problems(py, ipynb) + kernel_problems(ipynb) + output_problems(ipynb)


# --- the notebooks of this repository -----------------------------------------

STEMS = notebook_stems(NOTEBOOK_DIR)


@pytest.mark.parametrize("stem", STEMS)
def test_notebook_has_both_twins(stem: str) -> None:
    problems = twin_problems(NOTEBOOK_DIR, stem)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("stem", STEMS)
def test_notebook_twins_in_sync(stem: str) -> None:
    py, ipynb = NOTEBOOK_DIR / f"{stem}.py", NOTEBOOK_DIR / f"{stem}.ipynb"
    if not (py.exists() and ipynb.exists()):
        pytest.skip("a twin is missing: test_notebook_has_both_twins reports it")
    problems = sync_problems(py, ipynb)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("stem", STEMS)
def test_notebook_kernel_and_no_outputs(stem: str) -> None:
    ipynb = NOTEBOOK_DIR / f"{stem}.ipynb"
    if not ipynb.exists():
        pytest.skip("no .ipynb: test_notebook_has_both_twins reports it")
    problems = kernel_problems(ipynb) + output_problems(ipynb)
    assert not problems, "\n".join(problems)


ROOT = NOTEBOOK_DIR.parent
ANSWERS_DIR = ROOT / "docs" / "answers"


def teaching_problems(py: Path, answers_dir: Path) -> list[str]:
    """A notebook that does not link the glossary, or has exercises and no
    instructor's answer key (docs/answers/NN_name.md)."""
    text = py.read_text(encoding="utf-8")
    problems = []
    if "../docs/glossary.md" not in text:
        problems.append(f"{py.stem}: no link to the glossary (../docs/glossary.md)")
    if "## Exercises" in text and not (answers_dir / f"{py.stem}.md").exists():
        problems.append(f"{py.stem}: has exercises but no answer key {answers_dir.name}/{py.stem}.md")
    return problems


def broken_notebook_links(files: list[Path], folder: Path) -> list[str]:
    """Links to notebooks (NN_name.ipynb) that do not exist: what a renumbering leaves behind."""
    import re

    existing = {p.name for p in folder.glob("*.ipynb")}
    problems = []
    for f in files:
        for name in sorted(set(re.findall(r"\b(\d\d_[A-Za-z0-9_]+\.ipynb)", f.read_text(encoding="utf-8")))):
            if name not in existing:
                problems.append(f"{f.relative_to(f.parents[1])}: links {name}, which does not exist")
    return problems


@pytest.mark.parametrize("stem", STEMS)
def test_notebook_links_glossary_and_has_an_answer_key(stem: str) -> None:
    problems = teaching_problems(NOTEBOOK_DIR / f"{stem}.py", ANSWERS_DIR)
    assert not problems, "\n".join(problems)


def test_every_link_to_a_notebook_resolves() -> None:
    files = ([ROOT / "README.md", ROOT / "Makefile"] + sorted(NOTEBOOK_DIR.glob("*.py"))
             + sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "labkit").glob("*.py"))
             + sorted((ROOT / "tests" / "browser").glob("*.py")))
    problems = broken_notebook_links(files, NOTEBOOK_DIR)
    assert not problems, "\n".join(problems)


def test_teaching_checks_catch_a_missing_key_and_a_dead_link(tmp_path: Path) -> None:
    nb = tmp_path / "nb"
    nb.mkdir()
    (nb / "05_demo.py").write_text("# ## Exercises\n# 1. Why?\n", encoding="utf-8")
    (nb / "05_demo.ipynb").write_text("{}", encoding="utf-8")
    (tmp_path / "answers").mkdir()
    problems = teaching_problems(nb / "05_demo.py", tmp_path / "answers")
    assert any("glossary" in p for p in problems) and any("answer key" in p for p in problems)
    (tmp_path / "README.md").write_text("see [x](notebooks/05_demo.ipynb), [y](notebooks/09_gone.ipynb)")
    assert broken_notebook_links([tmp_path / "README.md"], nb) == [
        f"{tmp_path.name}/README.md: links 09_gone.ipynb, which does not exist"]


# --- self-tests: the checks catch what they should ----------------------------


def _write_pair(folder: Path, stem: str, cells: list[nbformat.NotebookNode]) -> tuple[Path, Path]:
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    py, ipynb = folder / f"{stem}.py", folder / f"{stem}.ipynb"
    jupytext.write(nb, py, fmt="py:percent")
    jupytext.write(nb, ipynb)
    return py, ipynb


def _cells() -> list[nbformat.NotebookNode]:
    return [
        nbformat.v4.new_markdown_cell("# Title\nWhat you will see."),
        nbformat.v4.new_code_cell("x = 1\nprint(x)"),
        nbformat.v4.new_code_cell("x + 1"),
    ]


def test_checks_pass_on_a_clean_pair(tmp_path: Path) -> None:
    _write_pair(tmp_path, "00_demo", _cells())
    assert notebook_stems(tmp_path) == ["00_demo"]
    assert all_problems(tmp_path, "00_demo") == []


def test_checks_report_an_out_of_sync_pair(tmp_path: Path) -> None:
    py, ipynb = _write_pair(tmp_path, "00_demo", _cells())
    nb = nbformat.read(ipynb, as_version=4)
    nb.cells[2].source = "x + 2"  # edited in Jupyter, .py not updated
    nbformat.write(nb, ipynb)
    problems = sync_problems(py, ipynb)
    assert len(problems) == 1
    assert "00_demo" in problems[0] and "cell 2" in problems[0]
    assert "line 1: 'x + 1' vs 'x + 2'" in problems[0]


def test_checks_report_a_changed_cell_type_and_an_extra_cell(tmp_path: Path) -> None:
    py, ipynb = _write_pair(tmp_path, "01_demo", _cells())
    nb = nbformat.read(ipynb, as_version=4)
    nb.cells[1] = nbformat.v4.new_markdown_cell(nb.cells[1].source)
    nbformat.write(nb, ipynb)
    assert "cell 1" in sync_problems(py, ipynb)[0]
    assert "markdown" in sync_problems(py, ipynb)[0]

    py, ipynb = _write_pair(tmp_path, "02_demo", _cells())
    py.write_text(py.read_text() + "\n# %%\nprint('added in the .py only')\n")
    problems = sync_problems(py, ipynb)
    assert problems and "4 cells" in problems[0] and "3" in problems[0]


def test_checks_report_a_missing_twin(tmp_path: Path) -> None:
    py, ipynb = _write_pair(tmp_path, "03_demo", _cells())
    ipynb.unlink()
    assert notebook_stems(tmp_path) == ["03_demo"]
    problems = all_problems(tmp_path, "03_demo")
    assert problems and "no 03_demo.ipynb twin" in problems[0]


def test_checks_report_outputs_errors_and_kernel(tmp_path: Path) -> None:
    py, ipynb = _write_pair(tmp_path, "04_demo", _cells())
    nb = nbformat.read(ipynb, as_version=4)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nb.cells[1].execution_count = 1
    nb.cells[2].outputs = [nbformat.v4.new_output("error", ename="NameError", evalue="x", traceback=[])]
    nb.metadata["kernelspec"]["name"] = "some-other-env"
    nbformat.write(nb, ipynb)
    problems = output_problems(ipynb)
    assert any("cell 1 stores 1 output" in p for p in problems)
    assert any("cell 1 stores execution_count" in p for p in problems)
    assert any("cell 2 stores an error output: NameError" in p for p in problems)
    assert "some-other-env" in kernel_problems(ipynb)[0]
    # outputs alone do not make a pair out of sync: only inputs are compared
    assert sync_problems(py, ipynb) == []
