"""pytest set-up of the packaging tests: the repository, its build directory ($MXFP8_BUILD, else build/, built by
`make build`), and one `cmake --install` of that build into a temporary prefix shared by the tests."""

import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("MXFP8_BUILD") or os.path.join(REPO, "build")


@pytest.fixture(scope="session")
def prefix(tmp_path_factory):
    """An installation prefix holding `cmake --install` of the build."""
    if not os.path.isfile(os.path.join(BUILD, "CMakeCache.txt")):
        pytest.fail(f"no CMake build in {BUILD}: run make build first")
    p = tmp_path_factory.mktemp("prefix")
    r = subprocess.run(["cmake", "--install", BUILD, "--prefix", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return p


def pkg_config(prefix, *args):
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    r = subprocess.run(["pkg-config", *args, "mxfp8"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()
