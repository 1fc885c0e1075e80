"""The committed corpus of malformed tensor files (tests/fuzz/corpus/{npy,safetensors}/bad_*, also the fuzzers'
seeds): the CLI rejects each one with exit status 2, one line 'mxfp8 <command>: error: ...' naming the file,
and leaves no output file -- for both commands that read tensors. Every other corpus file (valid files of each dtype
and fuzzer-found inputs) must give exit 0 or 2, never a crash.

The binary: $MXFP8_CLI, else mxfp8 in $MXFP8_BUILD_DIR (the directory `make` built), else build/ (build_paths.py); a
missing binary fails the tests.
"""

import os
import shutil
import subprocess

import pytest

from build_paths import CLI, REPO, require

CORPUS = os.path.join(REPO, "tests", "fuzz", "corpus")


@pytest.fixture(autouse=True)
def _cli_is_built():
    """A missing CLI fails every test here (it is part of the build), it never skips them."""
    require(CLI)


def corpus(kind, bad):
    d = os.path.join(CORPUS, kind)
    names = sorted(os.listdir(d)) if os.path.isdir(d) else []
    return [(kind, n) for n in names if n.startswith("bad_") == bad]


BAD = corpus("npy", True) + corpus("safetensors", True)
OTHER = corpus("npy", False) + corpus("safetensors", False)


def test_corpus_covers_every_malformed_case():
    """Each malformed case of the readers' contract has a file (the test fails if the corpus loses one)."""
    names = {n for _, n in BAD}
    for want in ["npy/bad_truncated", "npy/bad_hlen_past_end", "npy/bad_hlen_huge_v2", "npy/bad_dtype",
                 "npy/bad_overflow", "safetensors/bad_truncated", "safetensors/bad_hlen_past_end",
                 "safetensors/bad_hlen_huge", "safetensors/bad_offset_range", "safetensors/bad_overlap",
                 "safetensors/bad_reversed", "safetensors/bad_bytes_vs_shape", "safetensors/bad_dtype",
                 "safetensors/bad_duplicate", "safetensors/bad_utf8_name", "safetensors/bad_overflow"]:
        assert want.split("/")[1] in names and os.path.isfile(os.path.join(CORPUS, want)), want


def run(args, cwd):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("kind,name", BAD, ids=[f"{k}/{n}" for k, n in BAD])
@pytest.mark.parametrize("cmd", ["quantize", "dequantize"])
def test_malformed_file_rejected(tmp_path, kind, name, cmd):
    src = tmp_path / f"in.{kind}"
    shutil.copyfile(os.path.join(CORPUS, kind, name), src)
    r = run([cmd, src, "-o", tmp_path / "out.safetensors"], tmp_path)
    assert r.returncode == 2, f"rc {r.returncode}\nstdout:{r.stdout}\nstderr:{r.stderr}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mxfp8 {cmd}: error: "), r.stderr
    assert "in." + kind in lines[0], f"the message does not name the file: {lines[0]}"
    assert sorted(os.listdir(tmp_path)) == [src.name], os.listdir(tmp_path)


@pytest.mark.parametrize("kind,name", OTHER, ids=[f"{k}/{n}" for k, n in OTHER])
def test_other_corpus_files_never_crash(tmp_path, kind, name):
    src = tmp_path / f"in.{kind}"
    shutil.copyfile(os.path.join(CORPUS, kind, name), src)
    r = run(["quantize", src, "-o", tmp_path / "out.safetensors"], tmp_path)
    assert r.returncode in (0, 2), f"rc {r.returncode}\nstderr:{r.stderr}"
    if r.returncode == 2:
        assert sorted(os.listdir(tmp_path)) == [src.name], os.listdir(tmp_path)
