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
