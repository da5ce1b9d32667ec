"""Shared fixtures: the default model is loaded once per test session."""

import functools
import os

import pytest
import torch

# Tests never download anything.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@functools.lru_cache(maxsize=None)
def default_model(dtype: str = "fp32"):
    """The default model on the CPU, loaded once per process and dtype: a
    mutation run (scripts/mutation.py) forks a child per mutant from a process
    that has already loaded it, so the child does not load it again."""
    import labkit

    return labkit.load_model(device="cpu", dtype=dtype)


@pytest.fixture(scope="session")
def model():
    return default_model("fp32")


@pytest.fixture(scope="session")
def load_default():
    """load_default("bf16"): the default model in another dtype, loaded once."""
    return default_model


def pytest_collection_modifyitems(session, config, items):
    """Run the browser tests last. Playwright's sync API keeps an asyncio loop
    running in this thread until the session ends, and code that checks for a
    running loop (the widgets' debouncing) must not see it in the other tests."""
    items.sort(key=lambda item: "tests/browser/" in item.nodeid.replace("\\", "/"))


def pytest_addoption(parser):
    parser.addoption("--broken", default=None, metavar="VARIANT",
                     help="run the tests against labkit broken on purpose (tests/broken_variants.py); "
                          "a good suite fails")


def pytest_configure(config):
    name = config.getoption("--broken", default=None)
    if name:
        import broken_variants

        config._labkit_broken = broken_variants.apply(name)


def pytest_unconfigure(config):
    patch = getattr(config, "_labkit_broken", None)
    if patch is not None:
        patch.undo()
