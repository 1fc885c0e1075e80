"""Every ctypes mirror of a C struct in the Python package has the C struct's size, alignment and, field for field,
its names, offsets and sizes -- as the C compiler lays them out (the struct_layout program of the build directory,
tests/c/struct_layout.c, prints them). The program's tables are checked against the header itself, so a field added
to mxfp8.h cannot slip past both.
"""

import ctypes
import importlib
import json
import os
import pkgutil
import re
import subprocess

import pytest

import mxfp8
from build_paths import BUILD_DIR, REPO, require

HEADER = os.path.join(REPO, "include", "mxfp8.h")
# mxfp8_mpi.h and its program (tests/mpi/struct_layout_mpi.c) when CMake found MPI and built libmxfp8_mpi
MPI_HEADER = os.path.join(REPO, "include", "mxfp8_mpi.h")
MPI_PROG = os.path.join(BUILD_DIR, "struct_layout_mpi")


def _mpi_built():
    return os.path.isfile(MPI_PROG)


def header_structs():
    """{struct name: [field names]} of every `typedef struct name { ... } name;` in mxfp8.h (then mxfp8_mpi.h when
    the MPI library is built), in order."""
    text = re.sub(r"/\*.*?\*/", "", open(HEADER).read(), flags=re.S)
    if _mpi_built():
        text += re.sub(r"/\*.*?\*/", "", open(MPI_HEADER).read(), flags=re.S)
    out = {}
    for m in re.finditer(r"typedef struct (\w+)\s*\{(.*?)\}\s*(\w+);", text, re.S):
        names = []
        for decl in filter(None, (d.strip() for d in m.group(2).split(";"))):
            first, *more = decl.split(",")
            names.append(re.findall(r"(\w+)\s*(?:\[[^\]]*\])?\s*$", first)[0])  # "const T *name[..]" -> name
            names += [re.sub(r"[*\s]|\[.*\]", "", d) for d in more]
        out[m.group(1)] = names
    return out


@pytest.fixture(scope="module")
def c_layout():
    prog = require(os.path.join(BUILD_DIR, "struct_layout"), "the struct_layout program")
    out = {}
    for p in [prog] + ([MPI_PROG] if _mpi_built() else []):
        r = subprocess.run([p], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out.update(json.loads(r.stdout))
    return out


def mirrors():
    """{C struct name: ctypes class} of every ctypes.Structure defined in the mxfp8 package's modules (those that
    import without optional dependencies)."""
    out = {}
    for info in pkgutil.iter_modules(mxfp8.__path__):
        if not (info.ispkg or os.path.isfile(os.path.join(info.module_finder.path, info.name + ".py"))):
            continue  # the package's own libmxfp8.so, not a Python module
        try:
            mod = importlib.import_module(f"mxfp8.{info.name}")
        except ImportError as e:
            if info.name == "torch" or getattr(e, "name", "") == "torch":  # the PyTorch layer needs torch
                continue
            if info.name == "mpi" and not _mpi_built():  # expert parallelism: built only when CMake finds MPI
                continue
            raise
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, ctypes.Structure) and obj.__module__ == mod.__name__:
                name = obj.__dict__.get("_c_name")
                assert name, f"{mod.__name__}.{obj.__name__} mirrors no named C struct (set _c_name)"
                assert name not in out or out[name] is obj, f"two mirrors of {name}"
                out[name] = obj
    return out


def test_program_lists_every_struct_and_field(c_layout):
    want = header_structs()
    assert len(want) >= 12, sorted(want)
    assert list(c_layout) == list(want), "struct_layout(_mpi).c lists other structs than mxfp8.h (mxfp8_mpi.h)"
    for s, fields in want.items():
        assert [f[0] for f in c_layout[s]["fields"]] == fields, f"tests/c/struct_layout.c: fields of {s}"


def test_every_struct_has_a_mirror(c_layout):
    assert sorted(mirrors()) == sorted(c_layout)


@pytest.mark.parametrize("name", sorted(header_structs()))
def test_mirror_matches_c(c_layout, name):
    cls = mirrors()[name]
    c = c_layout[name]
    py_fields = [f[0] for f in cls._fields_]
    assert py_fields == [f[0] for f in c["fields"]], f"{cls.__qualname__}: field names / order differ from {name}"
    for fname, off, size in c["fields"]:
        d = getattr(cls, fname)
        assert (d.offset, d.size) == (off, size), f"{name}.{fname}: ctypes offset/size {(d.offset, d.size)}, C {off, size}"
    assert ctypes.sizeof(cls) == c["size"], f"sizeof({name}): ctypes {ctypes.sizeof(cls)}, C {c['size']}"
    assert ctypes.alignment(cls) == c["align"], f"alignof({name}): ctypes {ctypes.alignment(cls)}, C {c['align']}"
