"""Shared fixtures: the default model is loaded once per test session."""

import os

import pytest
import torch

# Tests never download anything.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def model():
    import labkit

    return labkit.load_model(device="cpu", dtype=torch.float32)


def pytest_collection_modifyitems(session, config, items):
    """Run the browser tests last. Playwright's sync API keeps an asyncio loop
    running in this thread until the session ends, and code that checks for a
    running loop (the widgets' debouncing) must not see it in the other tests."""
    items.sort(key=lambda item: "tests/browser/" in item.nodeid.replace("\\", "/"))
