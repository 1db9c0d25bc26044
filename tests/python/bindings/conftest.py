"""Fixtures of the binding suites: a synthetic checkpoint, calibrated scale packs, the
reference config at a small runtime size. The library comes from $QSAKV_LIB (CTest sets
it to the built target); the ctypes package from $PYTHONPATH (bindings/python)."""
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

if not (os.environ.get("QSAKV_LIB") or os.environ.get("QSAKV_LIBRARY")):
    pytest.exit("set QSAKV_LIB to the built libqsakv.so (ctest does)", returncode=2)


def no_gpu(reason: str):
    """Skips the module or test for want of a GPU, saying why; under QSAKV_REQUIRE_GPU=1
    (the GPU runs set it, CONTRIBUTING.md) fails instead, as the C suites do."""
    if os.environ.get("QSAKV_REQUIRE_GPU") == "1":
        pytest.fail(f"QSAKV_REQUIRE_GPU=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def write_checkpoint(root: Path) -> Path:
    """A base checkpoint directory: an index naming one weight file, and the file."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 1024},
         "weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}))
    (root / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 16)
    return root


@pytest.fixture
def checkpoint(tmp_path):
    return write_checkpoint(tmp_path / "base")


@pytest.fixture
def small_cfg():
    """The reference model at TP4 rank 0 (6 query heads, 1 KV head, head_dim 256) with
    the small runtime limits the demo uses."""
    import qsakv

    return qsakv.ModelConfig.preset("qwen4_exp", tp_size=4, max_batched_tokens=64,
                                    max_requests=8, max_model_len=8192)


@pytest.fixture
def cpu():
    import qsakv

    with qsakv.Context("cpu") as ctx:
        yield ctx


def run_isolated(code: str, timeout: float = 120):
    """Runs `code` in a fresh interpreter with this package and library, for what would
    crash the interpreter when the binding is wrong (a use after free): the test asserts
    the exit status (a segfault is -11) and the output, so that a regression fails the
    test instead of killing pytest. Returns the CompletedProcess (text, both streams)."""
    import subprocess
    import sys
    import textwrap

    import qsakv

    here = str(Path(__file__).resolve().parent)
    package_root = str(Path(qsakv.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [package_root, here] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["QSAKV_LIBRARY"] = str(Path(qsakv.library_path).resolve())
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)
