"""The `qsakv` tool's command line: --help on every area and verb, options a verb does
not take refused, --json where a script parses the output, verify/capacity with
--checkpoint, and inspect of a scale file that no manifest binds.
Needs QSAKV_LIB (libqsakv.so), QSAKV_TOOL (qsakv) and QSAKV_TEST_DATA (tests/data)."""
import ctypes
import hashlib
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

from cli_support import QSA_LAYERS, run_tool, write_pack
from qsakv import _cdefs  # struct layouts generated from include/qsakv.h

DATA = Path(os.environ.get("QSAKV_TEST_DATA", Path(__file__).resolve().parents[1] / "data"))
HF = DATA / "hf_config"

AREAS = {
    "overlay": ["inspect", "verify", "make", "materialize"],
    "calib": ["summarize", "merge", "envelope"],
    "capacity": [],
}


# --help ---------------------------------------------------------------------------------

def test_help_on_every_area_and_verb(env):
    _, tool = env
    for area, verbs in AREAS.items():
        area_help = run_tool(tool, area, "--help")
        assert area_help.returncode == 0, area_help.stderr
        assert area_help.stdout.startswith(f"usage: qsakv {area}")
        assert "exit codes: 0 success; 1 the library refused" in area_help.stdout
        assert area_help.stderr == ""
        for verb in verbs:
            assert f"qsakv {area} {verb}" in area_help.stdout, (area, verb)
            for args in ([verb, "--help"], [verb, "-h"], [verb, "x", "--help"]):
                r = run_tool(tool, area, *args)
                assert r.returncode == 0, (args, r.stderr)
                # The same wording for the area and each of its verbs.
                assert r.stdout == area_help.stdout, args
                assert r.stderr == ""
    top = run_tool(tool, "--help")
    assert top.returncode == 0 and "qsakv <area> <verb> --help" in top.stdout
    # Every verb as the top usage spells it (calib's verbs share one line).
    for needle in ("overlay inspect DIR", "overlay verify DIR", "overlay make --stats",
                   "overlay materialize BASE_DIR", "calib summarize STATS", "| merge OUT STATS",
                   "| envelope OUT STATS", "capacity [--preset"):
        assert needle in top.stdout, needle


def test_area_without_verb_is_a_usage_error(env):
    _, tool = env
    for area in ("overlay", "calib"):
        r = run_tool(tool, area)
        assert r.returncode == 2 and r.stderr.startswith(f"usage: qsakv {area}")
    r = run_tool(tool, "overlay", "frobnicate", "x")
    assert r.returncode == 2 and "inspect, verify, make, materialize" in r.stderr


# options a verb does not take ---------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["overlay", "inspect", "x", "--revision", "0" * 64], "does not take --revision"),
    (["overlay", "inspect", "x", "--tp", "4"], "does not take --tp"),
    (["overlay", "verify", "x", "--revision", "0" * 64, "--bogus", "1"], "unknown option --bogus"),
    (["overlay", "verify", "x", "--revision"], "--revision needs a value"),
    (["overlay", "verify", "x", "--revision", "0" * 64, "--preset", "qwen4_exp",
      "--checkpoint", "y"], "exclude each other"),
    (["overlay", "make", "--stats", "a", "--base-index", "b", "out", "--json"],
     "unknown option --json"),
    (["overlay", "materialize", "a", "b", "c", "--json"], "takes no options"),
    (["calib", "merge", "out", "a", "--json"], "does not take --json"),
    (["calib", "envelope", "out", "a", "--histograms"], "does not take --histograms"),
    (["calib", "summarize", "a", "--histograms"], "--histograms needs --json"),
    (["calib", "summarize", "a", "--bogus"], "unknown option --bogus"),
    (["capacity", "--bogus", "1"], "unknown option --bogus"),
    (["capacity", "extra"], "unexpected argument extra"),
    (["capacity", "--preset", "qwen4_exp", "--checkpoint", "x"], "exclude each other"),
    (["capacity", "--index-keys", "bf16"], "--index-keys must be fp16 or e4m3, not bf16"),
    (["capacity", "--index-keys"], "--index-keys needs a value"),
])
def test_unsupported_option_refused(env, args, needle):
    _, tool = env
    r = run_tool(tool, *args)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    assert needle in r.stderr, r.stderr
    assert r.stdout == ""


# overlay verify --json / --checkpoint -----------------------------------------------------

def test_verify_json(env, tmp_path):
    lib, tool = env
    pack, rev = write_pack(lib, tmp_path, tp=4)
    r = run_tool(tool, "overlay", "verify", pack, "--revision", rev, "--tp", "4", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["valid"] is True and doc["revision"] == rev and doc["path"] == str(pack)
    assert doc["config"]["tp_size"] == 4 and doc["config"]["qsa_layers"] == QSA_LAYERS
    assert doc["config"]["source_kind"] == "preset"
    # Refused (the contract says TP4): a JSON verdict on stdout, the usual line on stderr.
    r = run_tool(tool, "overlay", "verify", pack, "--revision", rev, "--tp", "2", "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["valid"] is False and doc["status"] == "QSAKV_ERROR_CONTRACT"
    assert r.stderr.strip() == f"{doc['status']}: {doc['message']}"
    assert "tp" in doc["message"].lower()


def test_verify_prints_the_revision_in_lower_case(env, tmp_path):
    """--revision in upper case is valid (the library compares lower-case) and printed as
    the library compares it; before, as typed."""
    lib, tool = env
    pack, rev = write_pack(lib, tmp_path)
    typed = rev[:32].upper() + rev[32:]
    r = run_tool(tool, "overlay", "verify", pack, "--revision", typed, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["revision"] == rev and doc["revision_from"] == "argument"
    r = run_tool(tool, "overlay", "verify", pack, "--revision", typed)
    assert r.returncode == 0 and f"base revision {rev}\n" in r.stdout
    # A mismatch names the revision in lower case too.
    other = "ab" * 32
    r = run_tool(tool, "overlay", "verify", pack, "--revision", other.upper(), "--json")
    assert r.returncode == 1
    assert json.loads(r.stdout)["status"] == "QSAKV_ERROR_REVISION_MISMATCH"
    assert other in r.stderr and other.upper() not in r.stderr

def test_verify_with_checkpoint_config(env, tmp_path):
    lib, tool = env
    pack, rev = write_pack(lib, tmp_path)
    for ckpt in (HF / "qwen4_exp", HF / "qwen4_exp" / "config.json"):
        r = run_tool(tool, "overlay", "verify", pack, "--revision", rev, "--checkpoint", ckpt)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("OK:") and f"checkpoint config {ckpt}" in r.stdout
    r = run_tool(tool, "overlay", "verify", pack, "--revision", rev, "--checkpoint",
            HF / "qwen4_exp", "--json")
    assert json.loads(r.stdout)["config"]["source_kind"] == "checkpoint"
    # A checkpoint whose QSA layers differ from the overlay's: the overlay does not fit.
    r = run_tool(tool, "overlay", "verify", pack, "--revision", rev, "--checkpoint", HF / "multimodal")
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR:") and "layer 11" in r.stderr
    # A broken config.json: the library's refusal, naming the key and the file.
    bad = HF / "missing_kv_heads.json"
    r = run_tool(tool, "overlay", "verify", pack, "--revision", rev, "--checkpoint", bad)
    assert r.returncode == 1
    assert r.stderr.startswith("QSAKV_ERROR_FORMAT:") and "num_key_value_heads" in r.stderr
    assert str(bad) in r.stderr


# overlay inspect ----------------------------------------------------------------------

def test_inspect_scale_file_without_manifest(env, tmp_path):
    lib, tool = env
    pack, _ = write_pack(lib, tmp_path)
    scale = pack / "model-kvscales.safetensors"
    bound = json.loads(run_tool(tool, "overlay", "inspect", pack, "--json").stdout)
    assert bound["bound"] is True
    (pack / "qsakv-overlay.json").unlink()
    for target in (scale, pack):
        r = run_tool(tool, "overlay", "inspect", target)
        assert r.returncode == 0, r.stderr
        assert "no manifest binds this file" in r.stdout
        assert bound["scale_file_sha256"] in r.stdout
        assert "     3  0.00999999978" in r.stdout
        r = run_tool(tool, "overlay", "inspect", target, "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["bound"] is False and doc["num_scales"] == 24
        assert doc["scale_file_sha256"] == bound["scale_file_sha256"]
        assert doc["layers"] == bound["layers"]
    # Inspecting is not validating: verify still refuses it.
    r = run_tool(tool, "overlay", "verify", scale, "--revision", "0" * 64)
    assert r.returncode == 1 and r.stderr.startswith("QSAKV_ERROR_OVERLAY_MISSING")
    # A manifest asked for by name that is missing is still a refusal.
    r = run_tool(tool, "overlay", "inspect", scale, "--manifest", tmp_path / "nope.json")
    assert r.returncode == 1 and r.stderr.startswith("QSAKV_ERROR_OVERLAY_MISSING")
    # No scale file at all: refused as before.
    r = run_tool(tool, "overlay", "inspect", tmp_path / "nothing")
    assert r.returncode == 1 and r.stderr.startswith("QSAKV_ERROR_OVERLAY_MISSING")


def test_inspect_half_pair_shows_null(env, tmp_path):
    _, tool = env
    header = json.dumps({"model.layers.3.self_attn.k_scale":
                         {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "model-kvscales.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 0.25))
    r = run_tool(tool, "overlay", "inspect", path, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["num_scales"] == 1
    assert doc["layers"] == [{"layer": 3, "k_scale": 0.25, "v_scale": None}]


def _rewrite_pack(pack, drop=None, add=None):
    """Rewrites the pack without tensor `drop` and with an F32 scalar `add` (a name): the
    scale file, and the manifest (its name list and the file's SHA-256), so that the pack
    still loads."""
    scale, manifest = pack / "model-kvscales.safetensors", pack / "qsakv-overlay.json"
    data = scale.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header, body = json.loads(data[8:8 + n]), data[8 + n:]
    out, payload = {"__metadata__": header.pop("__metadata__")}, b""
    for key, t in header.items():
        if key != drop:
            a, b = t["data_offsets"]
            out[key] = dict(t, data_offsets=[len(payload), len(payload) + b - a])
            payload += body[a:b]
    if add:
        out[add] = {"dtype": "F32", "shape": [], "data_offsets": [len(payload), len(payload) + 4]}
        payload += struct.pack("<f", 1.0)
    raw = json.dumps(out).encode()
    scale.write_bytes(struct.pack("<Q", len(raw)) + raw + payload)
    m = json.loads(manifest.read_text())
    m["tensor_names"] = [k for k in out if k != "__metadata__"]
    m["scale_file_sha256"] = hashlib.sha256(scale.read_bytes()).hexdigest()
    manifest.write_text(json.dumps(m))


def test_inspect_bound_shows_a_layer_with_one_half(env, tmp_path):
    """A bound pack whose layer 11 has its K scale only: inspect shows layer 11 with the V
    half as nan (null in JSON), as the unbound view does; before, the bound view left the
    layer out (it asked qsakv_overlay_get_scales, which answers only for whole pairs)."""
    lib, tool = env
    pack, rev = write_pack(lib, tmp_path)
    _rewrite_pack(pack, drop="model.layers.11.self_attn.v_scale")
    r = run_tool(tool, "overlay", "inspect", pack, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["bound"] is True and doc["num_scales"] == 23
    assert [e["layer"] for e in doc["layers"]] == QSA_LAYERS
    assert doc["layers"][2] == {"layer": 11, "k_scale": pytest.approx(0.03), "v_scale": None}
    r = run_tool(tool, "overlay", "inspect", pack)
    assert r.returncode == 0, r.stderr
    assert "scales:             23 (a K or V the file lacks shows as nan)" in r.stdout
    assert "    11  0.0299999993    nan" in r.stdout
    # The unbound view of the same file: the same rows.
    (pack / "qsakv-overlay.json").unlink()
    assert json.loads(run_tool(tool, "overlay", "inspect", pack, "--json").stdout)["layers"] \
        == doc["layers"]


def test_inspect_bound_refuses_what_is_not_a_scale(env, tmp_path):
    """A tensor that is not a K/V scale, which a pack may hold until it is validated: the
    bound view refuses it as the unbound view does, rather than leave it out."""
    lib, tool = env
    pack, _ = write_pack(lib, tmp_path)
    _rewrite_pack(pack, add="model.layers.3.mlp.gate_proj.weight")
    r = run_tool(tool, "overlay", "inspect", pack, "--json")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR:")
    assert "model.layers.3.mlp.gate_proj.weight" in r.stderr


# capacity -----------------------------------------------------------------------------

def test_capacity_json_and_checkpoint(env):
    lib, tool = env
    preset = json.loads(run_tool(tool, "capacity", "--tp", "4", "--budget-gib", "40", "--json").stdout)
    assert preset["bytes_per_token"] == 6912 and preset["fp16_bytes_per_token"] == 13056
    assert preset["model"] == "qwen4_exp" and preset["index_key_dtype"] == "fp16"
    r = run_tool(tool, "capacity", "--checkpoint", HF / "qwen4_exp", "--tp", "4", "--budget-gib", "40",
            "--json")
    assert r.returncode == 0, r.stderr
    ckpt = json.loads(r.stdout)
    assert ckpt["model"] == str(HF / "qwen4_exp")
    del ckpt["model"], preset["model"]
    assert ckpt == preset
    # Against the C API.
    cfg = _cdefs.qsakv_model_config()
    assert lib.qsakv_model_config_from_checkpoint(ctypes.byref(cfg),
                                                  str(HF / "multimodal").encode()) == 0
    cap = _cdefs.qsakv_capacity()
    cap.struct_size = ctypes.sizeof(cap)
    assert lib.qsakv_capacity_plan(ctypes.byref(cfg), 1 << 30, ctypes.byref(cap)) == 0
    doc = json.loads(run_tool(tool, "capacity", "--checkpoint", HF / "multimodal", "--budget-gib", "1",
                         "--json").stdout)
    assert doc["num_qsa_layers"] == 3
    assert doc["bytes_per_token"] == cap.bytes_per_token and doc["num_blocks"] == cap.num_blocks


def test_capacity_e4m3_index_keys(env):
    """--index-keys e4m3: 132 bytes per key of 128 dims (33 per token per layer), so the
    reference model at TP4 takes 6,540 bytes per token against 13,056 (FP16 baseline)."""
    lib, tool = env
    r = run_tool(tool, "capacity", "--preset", "qwen4_exp", "--tp", "4", "--index-keys", "e4m3",
            "--budget-gib", "40", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["index_key_dtype"] == "e4m3" and doc["kv_dtype"] == "e4m3"
    assert doc["compressed_bytes_per_token"] == 12 * 33
    assert doc["bytes_per_token"] == 6540 and doc["fp16_bytes_per_token"] == 13056
    assert doc["ideal_ratio"] >= 1.99 and doc["capacity_ratio"] >= 1.99
    # The same as the C API with config.index_key_dtype = E4M3.
    cfg = _cdefs.qsakv_model_config()
    assert lib.qsakv_model_config_preset(ctypes.byref(cfg), b"qwen4_exp") == 0
    cfg.tp_size, cfg.index_key_dtype = 4, _cdefs.QSAKV_DTYPE_E4M3
    cap = _cdefs.qsakv_capacity()
    cap.struct_size, cap.version = ctypes.sizeof(cap), _cdefs.QSAKV_CAPACITY_VERSION
    assert lib.qsakv_capacity_plan(ctypes.byref(cfg), 40 << 30, ctypes.byref(cap)) == 0
    assert doc["num_blocks"] == cap.num_blocks and doc["num_tokens"] == cap.num_tokens
    # The default is fp16; spelled out it is the same table.
    fp16 = json.loads(run_tool(tool, "capacity", "--tp", "4", "--index-keys", "fp16", "--budget-gib",
                          "40", "--json").stdout)
    assert fp16 == json.loads(run_tool(tool, "capacity", "--tp", "4", "--budget-gib", "40",
                                  "--json").stdout)
    assert fp16["bytes_per_token"] == 6912
    # The text table says which index keys it counts and prints the same figures.
    r = run_tool(tool, "capacity", "--preset", "qwen4_exp", "--tp", "4", "--index-keys", "e4m3")
    assert r.returncode == 0, r.stderr
    assert "e4m3 index keys" in r.stdout.splitlines()[0]
    total = next(l for l in r.stdout.splitlines() if l.strip().startswith("total"))
    assert "6540 B" in total and "13056 B" in total
    ratio = next(l for l in r.stdout.splitlines() if l.strip().startswith("ratio"))
    assert float(ratio.split()[1]) >= 1.99
    # A refused value: a usage error, nothing on stdout.
    r = run_tool(tool, "capacity", "--preset", "qwen4_exp", "--tp", "4", "--index-keys", "bf16")
    assert r.returncode == 2 and r.stdout == ""
    assert "--index-keys must be fp16 or e4m3, not bf16" in r.stderr
    assert "--index-keys fp16|e4m3" in run_tool(tool, "capacity", "--help").stdout


def test_capacity_bf16(env):
    """--kv bf16: a BF16 cache of a BF16 model (before, always INVALID_CONFIG, exit 1:
    the tool kept the preset's FP16 activations and had no --act)."""
    lib, tool = env
    r = run_tool(tool, "capacity", "--kv", "bf16", "--tp", "4", "--budget-gib", "40", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["kv_dtype"] == "bf16" and doc["activation_dtype"] == "bf16"
    cfg = _cdefs.qsakv_model_config()
    assert lib.qsakv_model_config_preset(ctypes.byref(cfg), b"qwen4_exp") == 0
    cfg.tp_size = 4
    cfg.kv_dtype = cfg.activation_dtype = _cdefs.QSAKV_DTYPE_BF16
    cap = _cdefs.qsakv_capacity()
    cap.struct_size, cap.version = ctypes.sizeof(cap), _cdefs.QSAKV_CAPACITY_VERSION
    assert lib.qsakv_capacity_plan(ctypes.byref(cfg), 40 << 30, ctypes.byref(cap)) == 0
    assert doc["bytes_per_token"] == cap.bytes_per_token == 13056
    assert doc["num_blocks"] == cap.num_blocks
    # Spelled out, the same table; the text names the activations.
    both = run_tool(tool, "capacity", "--kv", "bf16", "--act", "bf16", "--tp", "4",
                    "--budget-gib", "40", "--json")
    assert json.loads(both.stdout) == doc
    text = run_tool(tool, "capacity", "--kv", "bf16")
    assert text.returncode == 0 and "bf16 KV, bf16 activations" in text.stdout
    # E4M3 KV of a BF16 model: the same bytes as of an FP16 one.
    e4m3 = json.loads(run_tool(tool, "capacity", "--act", "bf16", "--tp", "4", "--json").stdout)
    fp16 = json.loads(run_tool(tool, "capacity", "--tp", "4", "--json").stdout)
    assert e4m3["activation_dtype"] == "bf16" and fp16["activation_dtype"] == "fp16"
    del e4m3["activation_dtype"], fp16["activation_dtype"]
    assert e4m3 == fp16
    # A 16-bit cache of the other activation type: the command line's fault.
    for kv, act in (("bf16", "fp16"), ("fp16", "bf16")):
        r = run_tool(tool, "capacity", "--kv", kv, "--act", act)
        assert r.returncode == 2 and r.stdout == "", (kv, act)
        assert f"--kv {kv} with --act {act}" in r.stderr
    r = run_tool(tool, "capacity", "--act", "fp32")
    assert r.returncode == 2 and "--act must be fp16 or bf16, not fp32" in r.stderr
    assert "--act fp16|bf16" in run_tool(tool, "capacity", "--help").stdout


# calib summarize --json ---------------------------------------------------------------

def test_calib_summarize_json(env, tmp_path):
    lib, tool = env
    ranks = []
    for r in range(4):
        # Each rank its own file: the same config at its own tp_rank.
        p = tmp_path / f"rank{r}.st"
        write_stats_rank(lib, p, r)
        ranks.append(p)
    r = run_tool(tool, "calib", "summarize", *ranks, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["tp_size"] == 4 and doc["ranks_covered"] == 4
    assert [e["layer"] for e in doc["layers"] if e["kind"] == "k"] == QSA_LAYERS
    k3 = next(e for e in doc["layers"] if e["layer"] == 3 and e["kind"] == "k")
    assert k3["max_abs"] == 1.0 and k3["count"] == 4 * 4 * 256
    assert "histogram" not in k3
    r = run_tool(tool, "calib", "summarize", *ranks, "--json", "--histograms")
    assert "histogram" in json.loads(r.stdout)["layers"][0]
    # Incomplete (one rank of four): refused, nothing on stdout.
    r = run_tool(tool, "calib", "summarize", ranks[0], "--json")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("QSAKV_ERROR_OVERLAY_INCOMPLETE")


def test_a_rank_that_missed_a_layer_is_refused(env, tmp_path):
    """At TP > 1 each rank holds other KV heads: summed with the others, a rank that never
    observed layer 11 would still give it a scale, blind to that rank's heads. Every
    command that merges refuses it, naming the input, its file, rank, layer and kind."""
    lib, tool = env
    ranks = []
    for rank in range(4):
        ranks.append(tmp_path / f"rank{rank}.st")
        write_stats_rank(lib, ranks[-1], rank, skip_layers=(11,) if rank == 1 else ())
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"weight_map": {}}')
    for args in (["calib", "summarize", *ranks], ["calib", "summarize", *ranks, "--json"],
                 ["calib", "merge", tmp_path / "merged.st", *ranks],
                 ["overlay", "make", "--stats", *ranks, "--base-index", index, tmp_path / "pack"]):
        r = run_tool(tool, *args)
        assert r.returncode == 1 and r.stdout == "", (args, r.stdout, r.stderr)
        assert r.stderr.startswith("QSAKV_ERROR_OVERLAY_INCOMPLETE: input 1 (TP rank 1 of 4) "
                                   "never observed layer 11 K and V (count 0)"), (args, r.stderr)
        assert f"  input 1: {ranks[1]}\n" in r.stderr, (args, r.stderr)
    assert not (tmp_path / "merged.st").exists() and not (tmp_path / "pack").exists()
    # Merging ranks 2 and 3 first changes nothing: rank 1 is still checked on its own.
    part = tmp_path / "ranks23.st"
    assert run_tool(tool, "calib", "merge", part, *ranks[2:]).returncode == 0
    r = run_tool(tool, "calib", "summarize", ranks[0], ranks[1], part)
    assert r.returncode == 1 and "input 1 (TP rank 1 of 4) never observed layer 11" in r.stderr


def write_stats_rank(lib, path, rank, skip_layers=()):
    opts = _cdefs.qsakv_context_options()
    assert lib.qsakv_context_options_init(ctypes.byref(opts)) == 0
    opts.backend = 1
    ctx = ctypes.POINTER(_cdefs.qsakv_context)()
    assert lib.qsakv_context_create(ctypes.byref(ctx), ctypes.byref(opts)) == 0
    cfg = _cdefs.qsakv_model_config()
    assert lib.qsakv_model_config_preset(ctypes.byref(cfg), b"qwen4_exp") == 0
    cfg.tp_size, cfg.tp_rank = 4, rank
    live = ctypes.POINTER(_cdefs.qsakv_calib)()
    assert lib.qsakv_calib_create(ctypes.byref(live), ctx, ctypes.byref(cfg)) == 0, \
        lib.qsakv_last_error()
    assert lib.qsakv_calib_start(live) == 0
    tokens, dim = 4, 256  # TP4: one KV head of 256 per rank
    for i, layer in enumerate(QSA_LAYERS):
        if layer in skip_layers:
            continue
        k = struct.pack(f"<{tokens * dim}e", *[(i + 1) * ((j % 7) - 3) / 3
                                                for j in range(tokens * dim)])
        v = struct.pack(f"<{tokens * dim}e", *[0.5] * (tokens * dim))
        assert lib.qsakv_calib_observe(live, layer, k, v, tokens, None) == 0, \
            lib.qsakv_last_error()
    host = ctypes.POINTER(_cdefs.qsakv_calib)()
    assert lib.qsakv_calib_snapshot(ctypes.byref(host), live, None) == 0
    assert lib.qsakv_calib_save(host, str(path).encode()) == 0, lib.qsakv_last_error()
    lib.qsakv_calib_destroy(host)
    lib.qsakv_calib_destroy(live)
    lib.qsakv_context_destroy(ctx)


# the command line's review (2026-12-05) ----------------------------------------------------

def _checkpoint(lib, root):
    """A checkpoint directory: the qwen4_exp config.json, an index, a weight file, and a
    pack bound to that index beside it (root/pack). Returns (checkpoint, pack, revision)."""
    root.mkdir()
    pack, rev = write_pack(lib, root)
    (root / "config.json").write_bytes((HF / "qwen4_exp" / "config.json").read_bytes())
    (root / "model-00001.safetensors").write_bytes(b"weights v1")
    return root, pack, rev


def test_verify_takes_the_revision_from_the_checkpoint(env, tmp_path):
    """--checkpoint BASE is BASE's revision too: equal to --revision or refused, and the
    revision when --revision is left out (before, BASE was only read for its config)."""
    lib, tool = env
    base, pack, rev = _checkpoint(lib, tmp_path / "base")
    r = run_tool(tool, "overlay", "verify", pack, "--checkpoint", base, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["revision"] == rev and doc["revision_from"] == "checkpoint"
    r = run_tool(tool, "overlay", "verify", pack, "--checkpoint", base / "config.json",
                 "--revision", rev.upper(), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["revision_from"] == "both"
    # Another checkpoint's index: refused whatever --revision says.
    other, _, other_rev = _checkpoint(lib, tmp_path / "other")
    (other / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    r = run_tool(tool, "overlay", "verify", pack, "--checkpoint", other, "--revision", rev,
                 "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["status"] == "QSAKV_ERROR_REVISION_MISMATCH"
    assert f"--revision is {rev}" in doc["message"] and str(other) in doc["message"]
    assert r.stderr.strip() == f"{doc['status']}: {doc['message']}"
    r = run_tool(tool, "overlay", "verify", pack, "--checkpoint", other)
    assert r.returncode == 1 and r.stderr.startswith("QSAKV_ERROR_REVISION_MISMATCH:")
    # A config without an index beside it: --revision is required.
    r = run_tool(tool, "overlay", "verify", pack, "--checkpoint", HF / "qwen4_exp")
    assert r.returncode == 2 and "--revision SHA is required" in r.stderr


def test_materialised_checkpoint_follows_its_base(env, tmp_path):
    """A materialised checkpoint verifies against itself while its base is the one it was
    built from, and not after the base changed in place under its links."""
    lib, tool = env
    base, pack, rev = _checkpoint(lib, tmp_path / "base")
    ckpt = tmp_path / "ckpt"
    r = run_tool(tool, "overlay", "materialize", base, pack, ckpt)
    assert r.returncode == 0, r.stderr
    assert f"(base revision {rev})" in r.stdout
    r = run_tool(tool, "overlay", "verify", ckpt, "--checkpoint", ckpt, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["revision"] == rev
    (base / "model.safetensors.index.json").write_text(
        '{"weight_map": {"lm_head.weight": "model-00001.safetensors", "x": "model-00001.safetensors"}}')
    (base / "model-00001.safetensors").write_bytes(b"weights v2")
    r = run_tool(tool, "overlay", "verify", ckpt, "--checkpoint", ckpt)
    assert r.returncode == 1 and r.stderr.startswith("QSAKV_ERROR_REVISION_MISMATCH:"), r.stderr
    r = run_tool(tool, "overlay", "verify", ckpt, "--revision", rev, "--checkpoint", ckpt)
    assert r.returncode == 1 and r.stderr.startswith("QSAKV_ERROR_REVISION_MISMATCH:"), r.stderr


def test_verify_says_when_the_overlay_is_a_unit_scale_control(env, tmp_path):
    lib, tool = env
    pack, rev = write_pack(lib, tmp_path)
    assert json.loads(run_tool(tool, "overlay", "verify", pack, "--revision", rev, "--json")
                      .stdout)["unit_scale_control"] is False
    opts = _cdefs.qsakv_overlay_write_options()
    assert lib.qsakv_overlay_write_options_init(ctypes.byref(opts)) == 0
    opts.base_index_path = str(tmp_path / "model.safetensors.index.json").encode()
    opts.unit_scale_control = 1
    n = len(QSA_LAYERS)
    ones = (ctypes.c_float * n)(*[1.0] * n)
    control = tmp_path / "control"
    assert lib.qsakv_overlay_write(str(control).encode(), (ctypes.c_int32 * n)(*QSA_LAYERS),
                                   ones, ones, n, ctypes.byref(opts)) == 0
    r = run_tool(tool, "overlay", "verify", control, "--revision", rev, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["unit_scale_control"] is True
    r = run_tool(tool, "overlay", "verify", control, "--revision", rev)
    assert r.returncode == 0 and "note: a unit-scale negative control" in r.stdout


def test_an_output_that_cannot_be_written_is_exit_1(env, tmp_path):
    lib, tool = env
    pack, rev = write_pack(lib, tmp_path)
    for args in (["capacity", "--json"], ["--version"],
                 ["overlay", "verify", pack, "--revision", rev, "--json"]):
        with open("/dev/full", "w") as full:
            r = subprocess.run([tool, *map(str, args)], stdout=full, stderr=subprocess.PIPE,
                               text=True)
        assert r.returncode == 1, args
        assert "qsakv: cannot write the output" in r.stderr, args


def test_json_stays_valid_for_paths_that_are_not_utf8(env, tmp_path):
    lib, tool = env
    pack, rev = write_pack(lib, tmp_path)
    odd = os.fsencode(tmp_path) + b"/pack-\xff\x01\"q"
    os.rename(pack, odd)
    r = subprocess.run([tool.encode(), b"overlay", b"verify", odd, b"--revision", rev.encode(),
                        b"--json"], capture_output=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout.decode("utf-8"))  # strict: every byte is UTF-8
    assert doc["path"].endswith("/pack-\ufffd\x01\"q")
    # A refusal's message repeats the path: its verdict is valid JSON too.
    r = subprocess.run([tool.encode(), b"overlay", b"verify", odd + b"-none", b"--revision",
                        rev.encode(), b"--json"], capture_output=True)
    assert r.returncode == 1
    doc = json.loads(r.stdout.decode("utf-8"))
    assert doc["status"] == "QSAKV_ERROR_OVERLAY_MISSING" and "\ufffd" in doc["message"]


@pytest.mark.parametrize("value", [" 1", "+1", "1 ", "", "1x", "0x10", "99999999999"])
def test_integers_are_digits_only(env, value):
    _, tool = env
    r = run_tool(tool, "overlay", "verify", "x", "--revision", "0" * 64, "--tp", value)
    assert r.returncode == 2 and "--tp: not an integer" in r.stderr, (value, r.stderr)


def four_ranks_and_empty_index(lib, tmp_path):
    """Statistics of TP ranks 0-3 (write_stats_rank) and a checkpoint index that maps no
    tensor: the inputs of `overlay make` when only its contract is under test."""
    ranks = []
    for rank in range(4):
        ranks.append(tmp_path / f"rank{rank}.st")
        write_stats_rank(lib, ranks[-1], rank)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"weight_map": {}}')
    return ranks, index


def test_make_checks_its_contract_before_reading(env, tmp_path):
    lib, tool = env
    ranks, index = four_ranks_and_empty_index(lib, tmp_path)
    base = ["overlay", "make", "--stats", tmp_path / "missing.st", "--base-index", index]
    for extra, needle in ((["--tp", "-5"], "--tp: 0 (any) or a TP size, 1 to 65536, not -5"),
                          (["--tp", "70000"], "--tp: 0 (any) or a TP size, 1 to 65536, not 70000"),
                          (["--spec", "-2"], "--spec: -1 (any) or 0 to 64 speculative tokens"),
                          (["--spec", "65"], "--spec: -1 (any) or 0 to 64 speculative tokens"),
                          (["--min-sm", "-1"], "--min-sm: 0 (any) or an SM, 1 to 10000"),
                          (["--min-sm", "10001"], "--min-sm: 0 (any) or an SM, 1 to 10000"),
                          (["--prefix", "model..layers"], "--prefix: a dotted name"),
                          (["--prefix", ".model"], "--prefix: a dotted name"),
                          (["--prefix", "model/layers"], "--prefix: a dotted name"),
                          (["--act", "fp32"], "--act must be fp16 or bf16, not fp32")):
        r = run_tool(tool, *base, tmp_path / "out", *extra)
        assert r.returncode == 2 and needle in r.stderr, (extra, r.stderr)
    # Above what a manifest may hold: the command line's fault (before, the library's
    # refusal, exit 1, after the statistics were read), and nothing is written.
    r = run_tool(tool, "overlay", "make", "--stats", *ranks, "--base-index", index,
                 tmp_path / "big", "--tp", "70000")
    assert r.returncode == 2 and "--tp: 0 (any) or a TP size" in r.stderr, r.stderr
    assert not (tmp_path / "big").exists()
    # The largest values in range are taken (and a dotted prefix other than the default).
    r = run_tool(tool, "overlay", "make", "--stats", *ranks, "--base-index", index,
                 tmp_path / "edge", "--tp", "65536", "--spec", "64", "--min-sm", "10000",
                 "--prefix", "model.language_model-2.layers_x")
    assert r.returncode == 0, r.stderr
    doc = json.loads(run_tool(tool, "overlay", "inspect", tmp_path / "edge", "--json").stdout)
    assert doc["contract"] == {"tp_size": 65536, "speculative_tokens": 64,
                               "activation_dtype": "fp16", "min_sm": 10000}
    assert doc["layer_prefix"] == "model.language_model-2.layers_x"


def test_make_binds_the_statistics_unless_told(env, tmp_path):
    """overlay make's contract: the statistics' TP size and activation dtype by default
    (the library's default too), `--tp 0` any TP size, explicit values as given."""
    lib, tool = env
    ranks, index = four_ranks_and_empty_index(lib, tmp_path)
    for name, extra, want in (
            ("default", [], {"tp_size": 4, "speculative_tokens": None,
                             "activation_dtype": "fp16", "min_sm": None}),
            ("any-tp", ["--tp", "0"], {"tp_size": None, "speculative_tokens": None,
                                       "activation_dtype": "fp16", "min_sm": None}),
            ("explicit", ["--tp", "2", "--spec", "1", "--act", "bf16", "--min-sm", "80"],
             {"tp_size": 2, "speculative_tokens": 1, "activation_dtype": "bf16", "min_sm": 80})):
        r = run_tool(tool, "overlay", "make", "--stats", *ranks, "--base-index", index,
                     tmp_path / name, *extra)
        assert r.returncode == 0, (name, r.stderr)
        manifest = json.loads((tmp_path / name / "qsakv-overlay.json").read_text())
        assert manifest["contract"] == want, (name, manifest["contract"])


def test_a_statistics_file_given_twice_is_refused(env, tmp_path):
    lib, tool = env
    stats = tmp_path / "rank.st"
    write_stats_rank(lib, stats, 0)
    link = tmp_path / "again.st"
    link.symlink_to(stats)
    for args in (["calib", "summarize", stats, stats], ["calib", "summarize", stats, link],
                 ["calib", "envelope", tmp_path / "out.st", stats, link],
                 ["calib", "merge", tmp_path / "out.st", link, stats]):
        r = run_tool(tool, *args)
        assert r.returncode == 2 and "are the same file" in r.stderr, (args, r.stderr)
    assert not (tmp_path / "out.st").exists()


def test_published_files_are_readable_as_the_umask_allows(env, tmp_path):
    lib, tool = env
    base, pack, _ = _checkpoint(lib, tmp_path / "base")
    old = os.umask(0o022)
    try:
        r = run_tool(tool, "overlay", "materialize", base, pack, tmp_path / "ckpt")
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ckpt").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "ckpt" / "qsakv-provenance.json").stat().st_mode & 0o777 == 0o644


def test_after_a_double_dash_every_argument_is_a_path(env, tmp_path):
    """Paths that start with '-' (or are '--help') after `--`: inspect reads a pack so
    named, and --help there is a path, not a request for the usage."""
    lib, tool = env
    pack, _ = write_pack(lib, tmp_path)
    dashed = tmp_path / "-pack"
    pack.rename(dashed)
    r = run_tool(tool, "overlay", "inspect", "--json", "--", "-pack", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["num_scales"] == 24
    # Without it the name is taken for an option.
    r = run_tool(tool, "overlay", "inspect", "-pack", cwd=tmp_path)
    assert r.returncode == 2 and "unknown option -pack" in r.stderr
    # After it, --help is a path (which does not exist), not the usage.
    r = run_tool(tool, "overlay", "inspect", "--", "--help", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("QSAKV_ERROR_OVERLAY_MISSING"), r.stderr
    r = run_tool(tool, "calib", "summarize", "--", "-no-such-stats", cwd=tmp_path)
    assert r.returncode == 1 and "-no-such-stats" in r.stderr, r.stderr
    # The library reads BASE_DIR first: its name in the refusal shows where each path went.
    r = run_tool(tool, "overlay", "materialize", "--", "-base", "-pack", "-out", cwd=tmp_path)
    assert r.returncode == 1 and "-base/model.safetensors.index.json" in r.stderr, r.stderr
    # `--` anywhere: tmp_path holds the pack's base index, so this one succeeds.
    r = run_tool(tool, "overlay", "materialize", ".", "--", "-pack", "-out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "-out" / "model-kvscales.safetensors").is_file()


@pytest.mark.parametrize("args, needle", [
    (["--tp", "0"], "--tp: a TP size, 1 to 65536, not 0"),
    (["--tp", "70000"], "--tp: a TP size, 1 to 65536, not 70000"),
    (["--tp", "2", "--rank", "2"], "--rank: 0 to 1 for --tp 2, not 2"),
    (["--rank", "-1"], "--rank: 0 to 0 for --tp 1, not -1"),
    (["--spec", "-1"], "--spec: 0 to 64 speculative tokens, not -1"),
    (["--spec", "65"], "--spec: 0 to 64 speculative tokens, not 65"),
    (["--preset", "nope"], "--preset: unknown preset \"nope\""),
    (["--act", "fp32"], "--act must be fp16 or bf16, not fp32"),
])
def test_verify_values_no_run_can_have_are_usage_errors(env, args, needle):
    _, tool = env
    for json_flag in ([], ["--json"]):  # --json too: a usage error, no verdict on stdout
        r = run_tool(tool, "overlay", "verify", "x", "--revision", "0" * 64, *args, *json_flag)
        assert r.returncode == 2 and needle in r.stderr, r.stderr
        assert r.stdout == ""


@pytest.mark.parametrize("revision", ["main", "0" * 63, "0" * 65, "g" * 64, "0" * 63 + " ",
                                      ""])
def test_verify_revision_that_is_no_sha256_is_a_usage_error(env, tmp_path, revision):
    """Exit 2 (before, the library's INVALID_ARGUMENT, exit 1), with --checkpoint too
    (before, a REVISION_MISMATCH)."""
    lib, tool = env
    base, pack, _ = _checkpoint(lib, tmp_path / "base")
    for extra in ([], ["--checkpoint", base]):
        r = run_tool(tool, "overlay", "verify", pack, "--revision", revision, *extra)
        assert r.returncode == 2, (extra, r.stderr)
        assert "--revision: a SHA-256, 64 hex digits" in r.stderr


def test_capacity_values_no_run_can_have_are_usage_errors(env):
    """capacity classifies as verify does: --tp 0 was exit 1 here (the library's
    INVALID_CONFIG) and exit 2 in verify."""
    _, tool = env
    for args, needle in ((["--tp", "0"], "--tp: a TP size, 1 to 65536, not 0"),
                         (["--tp", "-1"], "--tp: a TP size, 1 to 65536, not -1"),
                         (["--tp", "70000"], "--tp: a TP size, 1 to 65536, not 70000"),
                         (["--tp", "x"], "--tp: not an integer: x"),
                         (["--preset", "nope"], "--preset: unknown preset \"nope\"")):
        r = run_tool(tool, "capacity", *args)
        assert r.returncode == 2 and needle in r.stderr, (args, r.stderr)
        assert r.stdout == ""


def test_values_this_model_refuses_are_the_librarys_refusal(env, tmp_path):
    """In range, but not for this model: exit 1 with the library's status, in every
    command alike."""
    lib, tool = env
    pack, rev = write_pack(lib, tmp_path)
    for args in (["capacity", "--tp", "3"],
                 ["capacity", "--tp", "65536"],
                 ["overlay", "verify", pack, "--revision", rev, "--tp", "3"]):
        r = run_tool(tool, *args)
        assert r.returncode == 1, (args, r.stderr)
        assert r.stderr.startswith("QSAKV_ERROR_INVALID_CONFIG:"), (args, r.stderr)


def test_help_documents_the_exit_codes(env):
    _, tool = env
    top = run_tool(tool, "--help").stdout
    assert "2  bad command line: an unknown option" in top
    assert "--tp outside 1..65536" in top and "is the library's refusal: 1" in top
    for area in AREAS:
        text = run_tool(tool, area, "--help").stdout
        assert "a value that no run can have whatever the files and the model" in text, area
