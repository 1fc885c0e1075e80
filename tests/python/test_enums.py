"""The library's enumeration names (include/mxfp8.h, "Enumeration names") through every consumer: the Python tables
are the library's, every name and alias of a scale rule, group scheme, rounding, format and activation is accepted by
mxfp8.quantize / the MoE config / the torch recipes and by the CLI, and an unknown name gets the same message (the
library's, listing the names) from Python and from the CLI, prefixed by the parameter."""
import subprocess

import numpy as np
import pytest

import mxfp8
from mxfp8 import _lib
from build_paths import CLI, require

# written from the header's table (the spec), not read from the code under test
SPEC = {
    _lib.ENUM_FORMAT: (["e4m3", "e5m2"], {}),
    _lib.ENUM_FLOAT8_DTYPE: (["float8_e4m3fn", "float8_e5m2"], {}),
    _lib.ENUM_SCALE_RULE: (["nki", "ocp", "rceil"], {}),
    _lib.ENUM_GROUP_SCHEME: (["1x32", "wrapx"], {}),
    _lib.ENUM_SCALE_LAYOUT: (["compact", "nki_unpacked", "nki_packed", "swizzle_128x4"],
                             {"nki-unpacked": 1, "nki-packed": 2, "swizzle128x4": 3, "swizzle-128x4": 3}),
    _lib.ENUM_ROUNDING: (["nearest", "stochastic"], {}),
    _lib.ENUM_ACTIVATION: (["silu", "swish", "squared_relu", "gpt_oss_swiglu"], {"squaredrelu": 2, "relu2": 2}),
    _lib.ENUM_AFFINITY_OPTION: (["affinity_on_i", "affinity_on_h"], {"on_i": 0, "i": 0, "on_h": 1, "h": 1}),
    _lib.ENUM_LOOP_ORDER: (["mnk", "mkn", "nmk", "nkm", "kmn", "knm"], {}),
}


@pytest.mark.parametrize("enum_id", sorted(SPEC))
def test_python_tables_are_the_library_names(enum_id):
    names, aliases = SPEC[enum_id]
    t = _lib.EnumTable(enum_id)
    assert list(t.names) == names
    assert dict(t) == {**{n: v for v, n in enumerate(names)}, **aliases}
    for key, v in t.items():
        assert _lib.parse(t, key, "p") == v


def test_quantize_and_moe_config_accept_every_name():
    x = np.linspace(-3, 3, 2 * 128, dtype=np.float32).reshape(2, 128)
    for rule in SPEC[_lib.ENUM_SCALE_RULE][0]:
        for fmt in SPEC[_lib.ENUM_FORMAT][0]:
            for group in SPEC[_lib.ENUM_GROUP_SCHEME][0]:
                for rnd in SPEC[_lib.ENUM_ROUNDING][0]:
                    d, s = mxfp8.quantize(x, fmt=fmt, scale_rule=rule.upper(), group=group, rounding=rnd)
                    assert d.shape == x.shape
    acts, act_alias = SPEC[_lib.ENUM_ACTIVATION]
    affs, aff_alias = SPEC[_lib.ENUM_AFFINITY_OPTION]
    for name, want in [*((n, v) for v, n in enumerate(acts)), *act_alias.items()]:
        assert mxfp8.MXFP8MOEBwdConfig(activation_type=name)._to_c().activation == want
    for name, want in [*((n, v) for v, n in enumerate(affs)), *aff_alias.items()]:
        assert mxfp8.MXFP8MOEBwdConfig(affinity_option=name)._to_c().affinity_option == want
    with pytest.raises(ValueError, match=r"config.activation_type: unknown value 'gelu' \(expected silu, swish, squared_relu or "
                                         r"gpt_oss_swiglu\)"):
        mxfp8.MXFP8MOEBwdConfig(activation_type="gelu")._to_c()


def test_torch_recipe_takes_every_scale_rule():
    import torch
    from mxfp8.torch.recipes import MXFP8Recipe
    for rule in SPEC[_lib.ENUM_SCALE_RULE][0]:
        MXFP8Recipe("r", torch.float8_e4m3fn, torch.float8_e4m3fn, rule)
    with pytest.raises(ValueError, match=r"^MXFP8Recipe.scale_rule: unknown value 'bogus' \(expected nki, ocp or rceil\)"):
        MXFP8Recipe("r", torch.float8_e4m3fn, torch.float8_e4m3fn, "bogus")


@pytest.mark.parametrize("cmd,opt,param,enum_id", [
    ("moe-bwd", "--scale-rule", "scale_rule", _lib.ENUM_SCALE_RULE),
    ("moe-bwd", "--activation", "activation", _lib.ENUM_ACTIVATION),
    ("moe-bwd", "--float8-dtype", "float8_dtype", _lib.ENUM_FLOAT8_DTYPE),
    ("matmul-bwd", "--scale-layout", "layout", _lib.ENUM_SCALE_LAYOUT),
])
def test_unknown_name_same_message_in_cli_and_python(cmd, opt, param, enum_id):
    r = subprocess.run([require(CLI), cmd, opt, "e4m3" if enum_id == _lib.ENUM_FLOAT8_DTYPE else "bogus"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    with pytest.raises(ValueError) as e:
        _lib.parse(_lib.EnumTable(enum_id), "e4m3" if enum_id == _lib.ENUM_FLOAT8_DTYPE else "bogus", param)
    py = str(e.value)
    assert py.startswith(f"{param}: unknown value ")
    assert f"{opt}: {py[len(param) + 2:]}" in r.stderr, (r.stderr, py)
    names = SPEC[enum_id][0]
    assert all(n in py for n in names)


def _string_literals(path):
    """The string literals of a C file (comments removed first; escapes kept as written)."""
    import re
    text = open(path, encoding="utf-8").read()
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == "'":  # a character literal
            m = re.match(r"'(\\.|[^'\\])*'", text[i:])
            i += len(m.group(0)) if m else 1
        elif c == '"':
            m = re.match(r'"(\\.|[^"\\])*"', text[i:], re.S)
            out.append(m.group(0)[1:-1])
            i += len(m.group(0))
        else:
            i += 1
    return out


def test_no_c_file_spells_a_format_rule_or_activation_name():
    """Every scale-rule, format and activation name (canonical or alias) comes from the library's table
    (src/runtime/enums.c): no other C file of the library, the CLI or the bench holds one in a string literal."""
    import os
    import re
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    names = set()
    for e in (_lib.ENUM_FORMAT, _lib.ENUM_FLOAT8_DTYPE, _lib.ENUM_SCALE_RULE, _lib.ENUM_ACTIVATION):
        names |= set(SPEC[e][0]) | set(SPEC[e][1])
    word = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) +
                      r")(?![A-Za-z0-9_])")
    found = []
    for top in ("src", "tools", "bench"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                p = os.path.join(d, f)
                if not f.endswith((".c", ".h")) or p.endswith(os.path.join("src", "runtime", "enums.c")):
                    continue
                for lit in _string_literals(p):
                    for m in word.finditer(lit):
                        found.append(f"{os.path.relpath(p, root)}: {m.group(1)!r} in \"{lit[:60]}\"")
    assert not found, "\n".join(found)
