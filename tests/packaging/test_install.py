"""`cmake --install`: the library (shared and static), the header, the CLI with its plotting script, the pkg-config
file and the CMake package; a tiny consumer (consumer/) built through each of them runs."""

import os
import subprocess

from conftest import REPO, pkg_config

CONSUMER = os.path.join(REPO, "tests", "packaging", "consumer")


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_installed_files(prefix):
    for f in ("lib/libmxfp8.so", "lib/libmxfp8.so.0", "lib/libmxfp8.a", "include/mxfp8.h", "bin/mxfp8",
              "lib/pkgconfig/mxfp8.pc", "lib/cmake/mxfp8/mxfp8Config.cmake",
              "lib/cmake/mxfp8/mxfp8ConfigVersion.cmake", "lib/cmake/mxfp8/mxfp8Targets.cmake",
              "share/mxfp8/plot.py", "share/doc/mxfp8/LICENSE"):
        assert os.path.exists(prefix / f), f


def test_installed_cli_runs(prefix):
    out = run([prefix / "bin" / "mxfp8", "--version"])
    assert out.startswith("mxfp8 0.")
    assert "isa path" in run([prefix / "bin" / "mxfp8", "info"])
    ldd = run(["ldd", prefix / "bin" / "mxfp8"])
    assert str(prefix / "bin" / ".." / "lib" / "libmxfp8.so.0") in ldd or str(prefix / "lib") in ldd, ldd


def test_pkg_config_consumer(prefix, tmp_path):
    cflags, libs = pkg_config(prefix, "--cflags"), pkg_config(prefix, "--libs")
    libdir = pkg_config(prefix, "--variable=libdir")[0]
    exe = tmp_path / "consumer"
    run(["cc", os.path.join(CONSUMER, "consumer.c"), *cflags, *libs, f"-Wl,-rpath,{libdir}", "-lm", "-o", exe])
    assert run([exe]).startswith("consumer: ok ")
    assert "libmxfp8.so.0" in run(["ldd", exe])
    # static: the archive plus what pkg-config --static adds (OpenMP)
    other = pkg_config(prefix, "--static", "--libs-only-other")
    exe_s = tmp_path / "consumer_static"
    run(["cc", os.path.join(CONSUMER, "consumer.c"), *cflags, f"-L{libdir}", "-Wl,-Bstatic", "-lmxfp8",
         "-Wl,-Bdynamic", *other, "-lm", "-o", exe_s])
    assert run([exe_s]).startswith("consumer: ok ")
    assert "libmxfp8" not in run(["ldd", exe_s])


def test_cmake_find_package_consumer(prefix, tmp_path):
    build = tmp_path / "build"
    run(["cmake", "-S", CONSUMER, "-B", build, f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"])
    run(["cmake", "--build", build])
    assert run([build / "consumer"]).startswith("consumer: ok ")
    assert run([build / "consumer_static"]).startswith("consumer: ok ")
    assert "libmxfp8" not in run(["ldd", build / "consumer_static"])
