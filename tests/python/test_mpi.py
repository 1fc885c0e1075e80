"""Tests of mxfp8.mpi (expert parallelism over MPI, on mpi4py): each test starts mpi_worker.py under mpirun with 1..3
ranks (under a time limit, so a hang fails) and checks its verdict; the worker compares every rank's results bit for
bit with the single-process mxfp8 layer of the gathered problem. Also: `import mxfp8` works without mpi4py, and
`import mxfp8.mpi` then fails with an ImportError that says what is missing.

Skipped only when MPI itself is absent (no mpirun); a missing mpi4py or libmxfp8_mpi.so is a failure.
"""

import os
import shutil
import subprocess
import sys

import pytest

from build_paths import CLI, require

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "mpi_worker.py")
MPIRUN = shutil.which("mpirun") or shutil.which("mpiexec")
LIMIT = 240  # seconds per mpirun

pytestmark = pytest.mark.skipif(MPIRUN is None, reason="MPI is not installed (no mpirun on PATH)")


def _env():
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", MXFP8_NUM_THREADS="1")
    import mxfp8
    env.setdefault("PYTHONPATH", os.path.dirname(os.path.dirname(os.path.abspath(mxfp8.__file__))))
    return env


def _mpirun(ranks, mode, *flags):
    cmd = ["timeout", "-k", "10", str(LIMIT), MPIRUN, "-np", str(ranks), "--oversubscribe", *flags, sys.executable,
           WORKER, mode]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=LIMIT + 30)
    out = r.stdout + r.stderr
    assert r.returncode != 124, f"mpirun hit the {LIMIT} s limit (a hang?):\n{out}"
    assert r.returncode == 0, f"exit {r.returncode}:\n{out}"
    assert "all checks passed" in r.stdout, out
    return r.stdout


def test_import_without_mpi4py():
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "import mxfp8; mxfp8.info()\n"
            "try:\n    import mxfp8.mpi\nexcept ImportError as e:\n    print('IMPORTERROR', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "IMPORTERROR" in r.stdout and "mpi4py" in r.stdout, r.stdout


def test_library_present():
    import mxfp8.mpi as ep
    assert os.path.isfile(ep.library_path())


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_bitwise_equal_to_single_process(ranks):
    out = _mpirun(ranks, "bitwise")
    assert out.count(f"ok P={ranks} ") == 5, out


def test_bitwise_over_tcp():
    _mpirun(3, "bitwise", "--mca", "btl", "tcp,self")


@pytest.mark.parametrize("ranks", [2, 3])
def test_bad_argument_on_one_rank(ranks):
    out = _mpirun(ranks, "fault")
    assert f"rank {ranks - 1} of {ranks}" in out, out


# ---- the CLI: mpirun -np P mxfp8 moe-bwd --expert-parallel ----------------------------------------------------
def _cli(*args, ranks=None):
    cmd = [require(CLI), "moe-bwd", *args]
    if ranks:
        cmd = ["timeout", "-k", "10", str(LIMIT), MPIRUN, "-np", str(ranks), "--oversubscribe", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=LIMIT + 30)
    return r.returncode, r.stdout + r.stderr


def _topk_bundle(path, rng):
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file
    T, H, E, K, I = 90, 96, 5, 2, 64
    bf = ml_dtypes.bfloat16
    ids = np.array([rng.choice(E, K, replace=False) for _ in range(T)], np.int32)
    save_file({"hidden_states": rng.uniform(0, 1, (T, H)).astype(bf),
               "gate_up_proj_weight": rng.uniform(-0.1, 0.1, (E, H, 2, I)).astype(bf),
               "down_proj_weight": rng.uniform(-0.1, 0.1, (E, I, H)).astype(bf),
               "output_hidden_states_grad": rng.uniform(-1, 1, (T, H)).astype(bf),
               "topk_ids": ids, "topk_weights": rng.uniform(0, 1, (T, K)).astype(np.float32)}, path)


@pytest.mark.parametrize("ranks", [1, 3])
def test_cli_expert_parallel_writes_the_single_process_gradients(tmp_path, rng, ranks):
    """--inputs/--output: the same bundle gives byte-identical gradient files with and without --expert-parallel
    (explicit routing written by --save-inputs, with biases and AFFINITY_ON_H; and topk routing)."""
    b, sp, ep = (str(tmp_path / n) for n in ("b.safetensors", "sp.safetensors", "ep.safetensors"))
    rc, out = _cli("--T", "150", "--H", "64", "--I", "32", "--E", "5", "--B", "16", "--topk", "3", "--bias",
                   "--save-inputs", b, "--no-check", "--quiet")
    assert rc == 0, out
    for opts in (("--affinity", "on_h"), ("--block-size", "8")):
        if opts[0] == "--block-size":
            _topk_bundle(b, rng)
        rc, out = _cli("--inputs", b, "--output", sp, "--no-check", "--quiet", *opts)
        assert rc == 0, out
        rc, out = _cli("--expert-parallel", "--inputs", b, "--output", ep, *opts, ranks=ranks)
        assert rc == 0 and "verdict: PASS" in out, out
        assert open(sp, "rb").read() == open(ep, "rb").read()


def test_cli_expert_parallel_errors():
    rc, out = _cli("--expert-parallel", "--E", "2", "--topk", "1", ranks=3)
    assert rc != 0 and out.count("ranks <= experts") == 1, out  # one message, from rank 0
    rc, out = _cli("--expert-parallel", "--inputs", "/nonexistent/b.safetensors", ranks=2)
    assert rc != 0 and "cannot open" in out, out
    rc, out = _cli("--expert-parallel", "--T", "64", "--H", "64", "--I", "32", "--E", "4", "--B", "8",
                   "--topk", "2", "--wire", "mxfp8", ranks=2)
    assert rc == 0 and "per rank" in out, out


def _enum_names(enum_id):
    import mxfp8._lib as L
    lib = L.lib()
    return [lib.mxfp8_enum_name(enum_id, v).decode() for v in range(lib.mxfp8_enum_count(enum_id))]


def test_cli_expert_parallel_takes_every_layer_option(tmp_path):
    """Every activation, format (float8_dtype), scale rule and affinity option the library names, and the gpt-oss
    SwiGLU parameters, give byte-identical gradient files with and without --expert-parallel (2 ranks); stochastic
    rounding is refused under --expert-parallel with the reason; an unknown name gets the same message on both paths."""
    b, sp, ep = (str(tmp_path / n) for n in ("b.safetensors", "sp.safetensors", "ep.safetensors"))
    rc, out = _cli("--T", "64", "--H", "64", "--I", "32", "--E", "4", "--B", "16", "--topk", "2", "--bias",
                   "--save-inputs", b, "--no-check", "--quiet")
    assert rc == 0, out
    ACT, F8, RULE, AFF = 6, 1, 2, 7  # MXFP8_ENUM_ACTIVATION, _FLOAT8_DTYPE, _SCALE_RULE, _AFFINITY_OPTION
    acts, f8s, rules, affs = _enum_names(ACT), _enum_names(F8), _enum_names(RULE), _enum_names(AFF)
    assert "gpt_oss_swiglu" in acts and len(f8s) == 2 and len(rules) == 3
    cases = [("--activation", a) for a in acts] + [("--float8-dtype", f) for f in f8s]
    cases += [("--scale-rule", r) for r in rules] + [("--affinity", a) for a in affs]
    cases += [("--activation", "gpt_oss_swiglu", "--swiglu-alpha", "1.25", "--swiglu-limit", "2"),
              ("--stochastic-rounding", "none", "--rounding-seed", "3")]
    for opts in cases:
        rc, out = _cli("--inputs", b, "--output", sp, "--no-check", "--quiet", *opts)
        assert rc == 0, (opts, out)
        rc, out = _cli("--expert-parallel", "--inputs", b, "--output", ep, "--quiet", *opts, ranks=2)
        assert rc == 0 and "verdict: PASS" in out, (opts, out)
        assert open(sp, "rb").read() == open(ep, "rb").read(), opts
    rc, out = _cli("--expert-parallel", "--inputs", b, "--stochastic-rounding", "gradients", ranks=2)
    assert rc == 2 and out.count("--stochastic-rounding does not work with --expert-parallel") == 1, out
    for opt in ("--activation", "--scale-rule", "--float8-dtype", "--affinity"):
        rc1, out1 = _cli("--inputs", b, opt, "bogus")
        rc2, out2 = _cli("--expert-parallel", "--inputs", b, opt, "bogus", ranks=2)
        msg = [ln for ln in out1.splitlines() if "unknown value 'bogus'" in ln]
        assert rc1 == 2 and rc2 != 0 and len(msg) == 1 and msg[0] in out2, (out1, out2)
