#!/usr/bin/env python3
"""The mutation check (scripts/mutants.sh, `make mutants`): does the suite catch known kernel bugs?

For each mutant of scripts/mutants.list (file, exact original text, replacement, description) it applies the bug to
a scratch copy of the tree, rebuilds, runs the suite's fast subset -- ctest on the default ISA path and under
MXFP8_ISA=scalar, then the pytest files that check kernel results -- within a time limit, restores the file, and
prints one row: the mutant and the tests that failed ("killed"), or SURVIVED. Exit status 1 when any mutant
survives (or a mutant does not build, or the unmutated tree fails), 0 otherwise.

The scratch copy holds the files git tracks plus untracked ones that are not ignored, copied from the working tree
(so uncommitted work is what gets checked), in a temporary directory removed at the end. Before anything is built,
every `old:` text must occur exactly once in its file (or in the definition its `in:` line names); otherwise the
script stops and names the mutant.

Usage: scripts/mutants.sh [--list] [--fast] [--no-python] [--with-mpi] [--keep] [--timeout S] [--jobs N] [ID ...]
  ID ...       run only these mutants (default: all)
  --fast       stop testing a mutant at the first stage that kills it (the table then names fewer tests)
  --no-python  C tests only
  --with-mpi   also the ctests labelled mpi for every mutant (expert parallelism through mpirun; left out by
               default for time, except for the mutants marked `needs: mpi`, whose bugs only those tests reach)
  --timeout S  time limit of one mutant's test run, in seconds (default 900); a run past it counts as killed
  --keep       keep the scratch tree (its path is printed)
Environment: VENV (default .venv: its python runs pytest), JOBS (default 2).
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIST = os.path.join(ROOT, "scripts", "mutants.list")
PYTEST_FILES = ["tests/python/test_codecs.py", "tests/python/test_quant.py", "tests/python/test_matmul.py",
                "tests/python/test_moe.py", "tests/python/test_moe_nonfinite.py"]


class ListError(Exception):
    pass


def parse_list(path):
    """[(id, file, why, old, new, needs)] from the list file; ListError on a malformed block."""
    muts, cur = [], None
    with open(path, encoding="utf-8") as f:
        for ln, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            m = re.match(r"^\[([A-Za-z0-9_.-]+)\]\s+(\S+)\s*$", line)
            if m:
                cur = {"id": m.group(1), "file": m.group(2), "line": ln, "needs": ""}
                muts.append(cur)
                continue
            m = re.match(r"^(why|in|old|new|needs): ?(.*)$", line)
            if not m or cur is None:
                raise ListError(f"{path}:{ln}: expected '[id] file' or 'why:/in:/old:/new:/needs:', got {line!r}")
            cur[m.group(1)] = m.group(2)
    ids = set()
    for mu in muts:
        for key in ("why", "old", "new"):
            if key not in mu:
                raise ListError(f"{path}:{mu['line']}: mutant {mu['id']} has no '{key}:' line")
        if mu["id"] in ids:
            raise ListError(f"{path}:{mu['line']}: mutant id {mu['id']} appears twice")
        if mu["old"] == mu["new"]:
            raise ListError(f"{path}:{mu['line']}: mutant {mu['id']}: 'new' equals 'old'")
        ids.add(mu["id"])
    return muts


def region(text, mu):
    """(start, end) of the part of a file's text where the mutant's old text is looked for: the whole file, or, with
    `in:`, from the one occurrence of that text to the end of the definition it opens (the next line starting with
    '}'). Raises ListError when the `in:` text is missing or not unique."""
    if not mu.get("in"):
        return 0, len(text)
    n = text.count(mu["in"])
    if n != 1:
        raise ListError(f"{mu['id']}: the 'in:' text occurs {n} times in {mu['file']} (must be exactly once): "
                        f"{mu['in']!r}")
    start = text.index(mu["in"])
    end = text.find("\n}", start)
    return start, len(text) if end < 0 else end + 2


def apply(text, mu):
    """The file's text with the mutant applied (ListError unless its old text occurs exactly once where looked)."""
    start, end = region(text, mu)
    n = text.count(mu["old"], start, end)
    if n != 1:
        where = f"the definition opened by {mu['in']!r} in " if mu.get("in") else ""
        raise ListError(f"{mu['id']}: the original text occurs {n} times in {where}{mu['file']} (must be exactly "
                        f"once): {mu['old']!r}")
    i = text.index(mu["old"], start, end)
    return text[:i] + mu["new"] + text[i + len(mu["old"]):]


def check_texts(muts, tree):
    """Every old text occurs exactly once in its file or `in:` definition (in `tree`); returns the problems."""
    bad = []
    for mu in muts:
        p = os.path.join(tree, mu["file"])
        if not os.path.isfile(p):
            bad.append(f"{mu['id']}: file {mu['file']} does not exist")
            continue
        try:
            apply(open(p, encoding="utf-8").read(), mu)
        except ListError as e:
            bad.append(str(e))
    return bad


def cpu_flags():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def missing_features(needs, flags):
    """What of `needs` this machine lacks: CPU features, or mpirun for `mpi`."""
    want = {"avx512": ["avx512f", "avx512bw", "avx512vl"], "avx512_bf16": ["avx512f", "avx512bw", "avx512_bf16"],
            "amx": ["amx_tile", "amx_bf16"]}
    miss = []
    for n in needs.replace(",", " ").split():
        if n == "mpi":
            if shutil.which("mpirun") is None:
                miss.append("mpirun")
            continue
        if n not in want:
            raise ListError(f"unknown 'needs' value {n!r} (avx512, avx512_bf16, amx, mpi)")
        if any(f not in flags for f in want[n]):
            miss.append(n)
    return miss


def needs_mpi(m):
    return "mpi" in m["needs"].replace(",", " ").split()


def copy_tree(dst):
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in files:
        if not rel:
            continue
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src):  # deleted in the working tree
            continue
        os.makedirs(os.path.dirname(os.path.join(dst, rel)) or dst, exist_ok=True)
        shutil.copy2(src, os.path.join(dst, rel))


def run(cmd, cwd, env=None, timeout=None):
    """(returncode, output); returncode None on timeout."""
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        return p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode(errors="replace")


def build(tree, jobs):
    return run(["cmake", "--build", os.path.join(tree, "build"), "-j", str(jobs)], tree)


def ctest_failures(tree, isa, jobs, timeout, with_mpi):
    """Names of the failing ctests ('name' or 'name[scalar]'), or None on a timeout."""
    env = dict(os.environ)
    env.pop("MXFP8_ISA", None)
    if isa:
        env["MXFP8_ISA"] = isa
    build_dir = os.path.join(tree, "build")
    log = os.path.join(build_dir, "Testing", "Temporary", "LastTestsFailed.log")
    if os.path.exists(log):
        os.remove(log)
    cmd = ["ctest", "--test-dir", build_dir, "-j", str(jobs), "--timeout", str(max(60, timeout // 2))]
    if not with_mpi:
        cmd += ["-LE", "mpi"]  # the expert-parallel tests (mpirun, tens of seconds): --with-mpi adds them
    rc, out = run(cmd, tree, env, timeout)
    if rc is None:
        return None, out
    names = []
    if os.path.exists(log):
        for line in open(log, encoding="utf-8"):
            if ":" in line:
                names.append(line.strip().split(":", 1)[1] + (f"[{isa}]" if isa else ""))
    if rc != 0 and not names:  # e.g. a test that could not start
        names.append("ctest(exit %d)" % rc + (f"[{isa}]" if isa else ""))
    return names, out


def pytest_failures(tree, py, timeout):
    env = dict(os.environ)
    env.pop("MXFP8_ISA", None)
    env["PYTHONPATH"] = os.path.join(tree, "python")
    env["MXFP8_LIBRARY"] = os.path.join(tree, "build", "libmxfp8.so")
    rc, out = run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", *PYTEST_FILES], tree, env, timeout)
    if rc is None:
        return None, out
    files = {}
    for line in out.splitlines():
        m = re.match(r"^FAILED (tests/python/[^:]+)::", line)
        if m:
            files[m.group(1)] = files.get(m.group(1), 0) + 1
    names = [f"{os.path.basename(f)}({n})" for f, n in sorted(files.items())]
    if rc < 0:  # the library crashed the interpreter
        names.append(f"pytest(crashed: signal {-rc})")
    elif rc not in (0, 1) or (rc == 1 and not names):  # errors in collection, usage, internal errors
        names.append(f"pytest(exit {rc})")
    return names, out


def test_stages(tree, args, py, mpi):
    stages = [("ctest", lambda t: ctest_failures(tree, None, args.jobs, t, mpi)),
              ("ctest scalar", lambda t: ctest_failures(tree, "scalar", args.jobs, t, mpi))]
    if not args.no_python:
        stages.append(("pytest", lambda t: pytest_failures(tree, py, t)))
    return stages


def run_suite(tree, args, py, stop_early, mpi):
    """(killers, log, timed_out) of one run of the fast subset within args.timeout seconds (mpi: with the ctests
    labelled mpi)."""
    t0, killers, log = time.time(), [], []
    for name, fn in test_stages(tree, args, py, mpi):
        left = args.timeout - (time.time() - t0)
        if left <= 0:
            return killers + [f"time limit ({args.timeout} s)"], "\n".join(log), True
        names, out = fn(int(left))
        log.append(f"---- {name}\n{out}")
        if names is None:
            return killers + [f"{name}: time limit ({args.timeout} s)"], "\n".join(log), True
        killers += names
        if killers and stop_early:
            break
    return killers, "\n".join(log), False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ids", nargs="*", help="run only these mutants (default: all)")
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--fast", action="store_true",
                    help="stop testing a mutant at the first stage that kills it")
    ap.add_argument("--no-python", action="store_true", help="C tests only")
    ap.add_argument("--with-mpi", action="store_true", help="also the ctests labelled mpi (through mpirun)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch tree (its path is printed)")
    ap.add_argument("--timeout", type=int, default=900,
                    help="time limit of one mutant's test run in seconds (default 900); past it counts as killed")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", "2")),
                    help="parallel build and ctest jobs (default $JOBS or 2)")
    args = ap.parse_args()
    try:
        muts = parse_list(LIST)
    except ListError as e:
        print(f"mutants: {e}", file=sys.stderr)
        return 2
    unknown = [i for i in args.ids if i not in {m["id"] for m in muts}]
    if unknown:
        print(f"mutants: unknown mutant id(s): {' '.join(unknown)} (see scripts/mutants.list)", file=sys.stderr)
        return 2
    if args.ids:
        muts = [m for m in muts if m["id"] in args.ids]
    if args.list:
        for m in muts:
            print(f"{m['id']:34s} {m['file']:44s} {m['why']}")
        return 0
    bad = check_texts(muts, ROOT)
    if bad:
        print("mutants: the list no longer matches the sources (update the 'old:'/'new:' lines of "
              "scripts/mutants.list):", file=sys.stderr)
        for b in bad:
            print("  " + b, file=sys.stderr)
        return 2
    py = os.path.join(ROOT, os.environ.get("VENV", ".venv"), "bin", "python")
    if not args.no_python and not os.access(py, os.X_OK):
        print(f"mutants: {py} not found: run `make setup-test` first (or pass --no-python)", file=sys.stderr)
        return 2
    flags = cpu_flags()
    try:
        for m in muts:
            m["missing"] = missing_features(m["needs"], flags)
    except ListError as e:
        print(f"mutants: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: restore nothing, remove the scratch tree
    tree = tempfile.mkdtemp(prefix="mxfp8-mutants.")
    try:
        return mutate_all(tree, muts, args, py)
    finally:
        if args.keep:
            print(f"mutants: scratch tree kept at {tree}")
        else:
            shutil.rmtree(tree, ignore_errors=True)


def mutate_all(tree, muts, args, py):
    t0 = time.time()
    print(f"mutants: scratch copy of {ROOT} in {tree}", flush=True)
    copy_tree(tree)
    rc, out = run(["cmake", "-S", tree, "-B", os.path.join(tree, "build"), "-DCMAKE_BUILD_TYPE=Release",
                   "-DMXFP8_BUILD_TOOLS=OFF"], tree)
    if rc != 0:
        print(out + "\nmutants: cmake failed on the unmutated tree", file=sys.stderr)
        return 1
    rc, out = build(tree, args.jobs)
    if rc != 0:
        print(out + "\nmutants: the unmutated tree does not build", file=sys.stderr)
        return 1
    # the unmutated tree passes every test a mutant will run: the mpi ctests too when one of them needs them
    base_mpi = args.with_mpi or any(needs_mpi(m) and not m["missing"] for m in muts)
    killers, log, _ = run_suite(tree, args, py, False, base_mpi)
    if killers:
        print(log + f"\nmutants: the unmutated tree fails ({', '.join(killers)}): fix that first", file=sys.stderr)
        return 1
    print(f"mutants: unmutated tree passes ({time.time() - t0:.0f} s); {len(muts)} mutant(s)", flush=True)
    rows, failed = [], 0
    for i, m in enumerate(muts, 1):
        t1 = time.time()
        if m["missing"]:
            rows.append((m, f"not run: this machine lacks {', '.join(m['missing'])}", 0.0))
            print(f"[{i}/{len(muts)}] {m['id']}: not run (this machine lacks {', '.join(m['missing'])})", flush=True)
            continue
        path = os.path.join(tree, m["file"])
        orig = open(path, encoding="utf-8").read()
        open(path, "w", encoding="utf-8").write(apply(orig, m))
        try:
            rc, out = build(tree, args.jobs)
            if rc != 0:
                verdict, failed = "BUILD FAILED (fix the mutant's 'new:' text)", failed + 1
                print(out[-3000:], file=sys.stderr)
            else:
                killers, log, _ = run_suite(tree, args, py, args.fast, args.with_mpi or needs_mpi(m))
                if killers:
                    verdict = "killed by " + ", ".join(killers)
                else:
                    verdict, failed = "SURVIVED", failed + 1
        finally:
            open(path, "w", encoding="utf-8").write(orig)
        rows.append((m, verdict, time.time() - t1))
        print(f"[{i}/{len(muts)}] {m['id']}: {verdict} ({time.time() - t1:.0f} s)", flush=True)
    build(tree, args.jobs)  # leave the scratch build unmutated (for --keep)
    print()
    w = max(len(m["id"]) for m, _, _ in rows)
    print(f"{'mutant':{w}s}  result")
    print(f"{'-' * w}  {'-' * 60}")
    for m, verdict, _ in rows:
        print(f"{m['id']:{w}s}  {verdict}")
    survived = sum(1 for _, v, _ in rows if v == "SURVIVED")
    notrun = sum(1 for _, v, _ in rows if v.startswith("not run"))
    print(f"\nmutants: {len(rows) - survived - notrun - (failed - survived)} killed, {survived} survived, "
          f"{failed - survived} did not build, {notrun} not run (CPU features, mpirun) in {time.time() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
