"""Fixtures of the `qsakv` tool's tests (helpers in cli_support.py). Imported inside the
fixture: test_demo.py shares this folder and runs without the Python package on its
path."""
import pytest


@pytest.fixture(scope="module")
def env():
    from cli_support import load_library_and_tool

    return load_library_and_tool()
