"""Every code block of README.md runs as written: the Python blocks with this interpreter (the package installed
in .venv), the C blocks compiled through the pkg-config file of `cmake --install` and linked with its rpath, as the
README's build line says. Shell blocks are commands for the reader (make, cmake, cc), not run here; the README's
first lines must stay `make run` and `make test`."""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, pkg_config

README = open(os.path.join(REPO, "README.md")).read()
BLOCKS = [(m.group(1), m.group(2), README[:m.start()].count("\n") + 1)
          for m in re.finditer(r"^```(\w*)\n(.*?)^```", README, re.S | re.M)]


def test_readme_starts_with_the_two_commands():
    lang, body, _ = BLOCKS[0]
    lines = [line.split("#")[0].strip() for line in body.strip().splitlines()]
    assert lang == "sh" and lines == ["make run", "make test"], body


def test_readme_has_python_and_c_examples():
    langs = [b[0] for b in BLOCKS]
    assert "python" in langs and "c" in langs, langs


@pytest.mark.parametrize("index", [i for i, b in enumerate(BLOCKS) if b[0] == "python"])
def test_python_block_runs(tmp_path, index):
    _, body, line = BLOCKS[index]
    (tmp_path / "block.py").write_text(body)
    r = subprocess.run([sys.executable, "block.py"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, f"README.md line {line}:\n{r.stdout}\n{r.stderr}"


@pytest.mark.parametrize("index", [i for i, b in enumerate(BLOCKS) if b[0] == "c"])
def test_c_block_builds_with_pkg_config_and_runs(prefix, tmp_path, index):
    _, body, line = BLOCKS[index]
    (tmp_path / "example.c").write_text(body)
    libdir = pkg_config(prefix, "--variable=libdir")[0]
    cmd = ["cc", "-std=c11", "-Wall", "-Werror", "example.c", *pkg_config(prefix, "--cflags", "--libs"),
           f"-Wl,-rpath,{libdir}", "-o", "example"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, f"README.md line {line}: {' '.join(cmd)}\n{r.stderr}"
    r = subprocess.run(["./example"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, f"README.md line {line}:\n{r.stdout}\n{r.stderr}"
    assert r.stdout.strip(), "the example prints its result"
