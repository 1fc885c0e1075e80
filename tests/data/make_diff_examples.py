"""Makes the examples of `mxfp8 diff` in tests/data/ (from the repository root, with the package installed:
python tests/data/make_diff_examples.py).

Each example is a pair diff_<class>_input.safetensors (tensor "x", float32 [8, 256]) and
diff_<class>_other.safetensors ("data" E4M3 codes, "scales" E8M0 codes, quantized along axis 1), where "other" is what
a quantizer with one documented non-standard policy gives -- written here, with mxfp8.quantize (OCP rule, the base
profile; RCEIL for pow2) for every other group and numpy / ml_dtypes for the policy itself (no other stack's
output). Policies:

  bitwise     none: the base profile itself (diff reports "bitwise equal")
  tiny        a floor-rule quantizer that takes the shared exponent one step too large when amax < 2^-118 (the
              scale exponent would clamp at -127): those groups come back halved
  pow2        an RCEIL quantizer taking ceil(log2(amax / 448)) in float32: for amax just above 448 * 2^-10 the
              float32 log2 rounds to -10 exactly, so the scale is one step too small and the top elements saturate
  nonfinite   a group with an Inf takes its exponent from the Inf's bit pattern (exponent field 255: code 247),
              so the finite elements become 0 and the Inf a NaN code
  saturation  values beyond max normal clip to 2^8 = 256 instead of 448
  subnormal   FP8 subnormal results are flushed to zero (sign kept)
  zero-sign   negative values that round to zero come back +0 (an input -0.0 stays -0)
  rounding    elements rounded stochastically (our own stochastic rounding, mxfp8.quantize(rounding="stochastic",
              seed=11)): same scales, some elements on the other side of x / 2^e
"""

import os

import ml_dtypes
import numpy as np

import mxfp8

HERE = os.path.dirname(os.path.abspath(__file__))
E4M3 = ml_dtypes.float8_e4m3fn


def codes_for(x, e):
    """E4M3 codes of x (1-D float32) with shared exponent e: RNE of x * 2^-e, saturating to 448."""
    y = np.clip(x.astype(np.float64) * 2.0 ** -e, -448, 448).astype(np.float32)
    return y.astype(E4M3).view(np.uint8)


def base(x, rule):
    d, s = mxfp8.quantize(x, "e4m3", axis=1, scale_rule=rule)
    return d.view(np.uint8).copy(), s.copy()


def example(rng, name):
    x = rng.standard_normal((8, 256)).astype(np.float32)
    rows = [1, 4, 6]  # the groups (row r, group r % 8) that follow the policy
    if name in ("tiny",):
        for r in rows:
            x[r, 32 * r: 32 * r + 32] *= np.float32(2.0 ** -122)
    if name == "pow2":
        for r in rows:
            g = x[r, 32 * r: 32 * r + 32]
            g[:] = np.clip(g, -1, 1) * np.float32(300 * 2.0 ** -10)
            g[3] = np.float32(448 * 2.0 ** -10 * (1 + 2.0 ** -22))
    if name == "nonfinite":
        for r in rows:
            x[r, 32 * r + 5] = np.inf if r % 2 else -np.inf
    if name == "saturation":  # amax 1.99 * 2^k: x / 2^e reaches 1.99 * 256 = 509 > 448
        for r in rows:
            x[r, 32 * r] = np.float32(1.99 * 2.0 ** np.ceil(np.log2(np.abs(x[r, 32 * r: 32 * r + 32]).max())))
    if name == "subnormal" or name == "zero-sign":
        for r in rows:
            g = x[r, 32 * r: 32 * r + 32]
            g[:] = np.sign(g) * np.float32(0.5)
            g[0] = 1.0  # amax 1: e = -8 under the OCP rule
            g[1:6] = np.float32(-2.0 ** -15) if name == "subnormal" else np.float32(-2.0 ** -20)
            if name == "zero-sign":
                g[6] = np.float32(-0.0)
    rule = "rceil" if name == "pow2" else "ocp"
    d, s = base(x, rule)
    if name == "rounding":
        sr_codes = mxfp8.quantize(x, "e4m3", axis=1, scale_rule=rule, rounding="stochastic", seed=11)[0].view(np.uint8)
    for r in rows:
        sl = slice(32 * r, 32 * r + 32)
        g, e = x[r, sl], int(s[r, r]) - 127
        if name == "tiny":
            s[r, r] += 1
            d[r, sl] = codes_for(g, e + 1)
        elif name == "pow2":
            amax = np.float32(np.abs(g).max())
            eb = int(np.ceil(np.log2(amax / np.float32(448)).astype(np.float32)))
            s[r, r] = eb + 127
            d[r, sl] = codes_for(g, eb)
        elif name == "nonfinite":
            s[r, r] = 247
            d[r, sl] = np.where(np.isinf(g), 0x7F | np.where(g < 0, 0x80, 0), np.where(np.signbit(g), 0x80, 0))
        elif name == "saturation":
            y = g.astype(np.float64) * 2.0 ** -e
            clip = np.abs(y) > 256
            d[r, sl] = np.where(clip, np.where(y < 0, 0xF8, 0x78), d[r, sl])  # +-256
        elif name == "subnormal":
            c = d[r, sl]
            d[r, sl] = np.where(((c & 0x7F) > 0) & ((c & 0x7F) < 8), c & 0x80, c)
        elif name == "zero-sign":
            c = d[r, sl]
            d[r, sl] = np.where((c == 0x80) & ~((g == 0) & np.signbit(g)), 0, c)
        elif name == "rounding":
            d[r, sl] = sr_codes[r, sl]
    d0, s0 = base(x, rule)
    assert (name == "bitwise") == (np.array_equal(d, d0) and np.array_equal(s, s0)), name
    return x, d.view(E4M3), s


def main():
    rng = np.random.default_rng(2026)
    for name in ("bitwise", "tiny", "pow2", "nonfinite", "saturation", "subnormal", "zero-sign", "rounding"):
        x, d, s = example(rng, name)
        mxfp8.save(os.path.join(HERE, f"diff_{name}_input.safetensors"), {"x": x})
        mxfp8.save(os.path.join(HERE, f"diff_{name}_other.safetensors"), {"data": d, "scales": s})
        print(f"wrote diff_{name}_input.safetensors, diff_{name}_other.safetensors")


if __name__ == "__main__":
    main()
