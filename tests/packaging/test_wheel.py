"""The Python wheel: built outside the source tree (nothing left in it), it ships the library, the CLI
(mxfp8/bin/mxfp8) and the plotting module, and a fresh virtual environment that installs it gets a working `mxfp8`
command, `python -m mxfp8` and `import mxfp8`."""

import glob
import os
import subprocess
import sys
import zipfile

import numpy as np

from conftest import REPO


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=1800, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def tree(path):
    """Every path under the repository, ignored build output included (but not what git itself keeps)."""
    out = set()
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d != ".git"]
        rel = os.path.relpath(root, path)
        out.update(os.path.join(rel, n) for n in dirs + files)
    return out


def test_wheel_in_a_fresh_venv(tmp_path):
    top_before = set(os.listdir(REPO))
    python_before = tree(os.path.join(REPO, "python"))
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", dist, REPO])
    assert set(os.listdir(REPO)) == top_before, "pip wheel left files at the top of the source tree"
    assert tree(os.path.join(REPO, "python")) - python_before <= {p for p in tree(os.path.join(REPO, "python"))
                                                                  if "__pycache__" in p}
    (whl,) = glob.glob(str(dist / "mxfp8-*.whl"))
    names = zipfile.ZipFile(whl).namelist()
    for f in ("mxfp8/bin/mxfp8", "mxfp8/libmxfp8.so", "mxfp8/plot.py", "mxfp8/__main__.py", "mxfp8/_cli.py",
              "mxfp8_cli/__init__.py"):
        assert f in names, f
    ep = [n for n in names if n.endswith("entry_points.txt")]
    assert ep and "mxfp8 = mxfp8_cli:main" in zipfile.ZipFile(whl).read(ep[0]).decode()

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])
    run([venv / "bin" / "python", "-m", "pip", "install", "-q", whl])
    work = tmp_path / "work"
    work.mkdir()
    out = run([venv / "bin" / "mxfp8", "--help"], cwd=work)
    assert "usage: mxfp8 <command>" in out and "moe-bwd" in out and "bench" in out
    assert run([venv / "bin" / "python", "-m", "mxfp8", "--version"], cwd=work).startswith("mxfp8 0.")
    assert "isa path" in run([venv / "bin" / "mxfp8", "info"], cwd=work)
    np.save(work / "x.npy", np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32))
    run([venv / "bin" / "mxfp8", "quantize", "x.npy", "-o", "q.safetensors"], cwd=work)
    out = run([venv / "bin" / "python", "-c", "import mxfp8; print(mxfp8.__file__, mxfp8.info()['library'])"],
              cwd=work)
    assert str(venv) in out, out
    r = subprocess.run([venv / "bin" / "mxfp8", "bench", "--bogus"], capture_output=True, text=True, cwd=work)
    assert r.returncode == 2 and r.stderr.startswith("mxfp8 bench: error: ")
