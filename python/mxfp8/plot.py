"""Pictures of what the ``mxfp8`` command measured, drawn with matplotlib.

    python -m mxfp8.plot bench RESULTS.json OUT.png      # from `mxfp8 bench --json` (what `mxfp8 bench --plot` runs)
    python -m mxfp8.plot quantize STATS.json OUT.png     # what `mxfp8 quantize --stats --plot` runs
    python -m mxfp8.plot check                            # is matplotlib there? (the CLI asks before its work)

``bench``: one bar pair per measured row (matmul backward/forward per (M, K, N), MoE backward/forward per
problem): libmxfp8's fraction of the machine's peak beside oneDNN's bf16 matmul doing the same GEMMs without
quantization; the height ratio of a pair is the speed-up. ``quantize``: the histogram of the E8M0 scale codes (as
exponents, code - 127) and the histogram of the per-group relative error ||x - dequantize(quantize(x))|| / ||x||.

This module needs only the standard library and matplotlib (it is also run as a plain script by the CLI). Exit
status: 0 written, 2 bad usage or input, 3 matplotlib is not installed.
"""

import json
import os
import sys
import tempfile

USAGE = "usage: python -m mxfp8.plot bench|quantize INPUT.json OUTPUT.png, or python -m mxfp8.plot check"
NO_MATPLOTLIB = 3


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bench_rows(doc):
    """(label, mxfp8 fraction of peak, oneDNN fraction of peak) for every row with a time."""
    rows = []
    for r in doc.get("matmul", []):
        op = "bwd" if r.get("op") == "backward" else "fwd"
        rows.append((f"matmul {op}\n{r['M']}x{r['K']}x{r['N']}", r.get("fraction_of_peak"),
                     r.get("onednn_fraction_of_peak")))
    for key, op in (("moe", "bwd"), ("moe_forward", "fwd")):
        for r in doc.get(key, []):
            cfg = "\ntraining" if r.get("configuration") == "training" else ""
            label = f"moe {op}\n({r['H']},{r['T']},{r['E']},\n{r['B']},{r['TopK']},{r['I']}){cfg}"
            rows.append((label, r.get("fraction_of_peak_all_blocks"), r.get("onednn_fraction_of_peak_all_blocks")))
    return [r for r in rows if r[1] is not None]


def plot_bench(doc, out, plt):
    rows = _bench_rows(doc)
    if not rows:
        raise ValueError("the results hold no matmul or moe row with a time (run the matmul or moe section)")
    peaks = doc.get("peaks", {})
    ref = peaks.get("reference") or "?"
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 2), 4.8))
    x = range(len(rows))
    w = 0.4
    ours = [r[1] for r in rows]
    theirs = [r[2] if r[2] is not None else 0.0 for r in rows]
    ax.bar([i - w / 2 for i in x], ours, w, label=f"libmxfp8 {doc.get('library_version', '')} (MXFP8)")
    onednn = doc.get("onednn", {})
    if onednn.get("linked"):
        ax.bar([i + w / 2 for i in x], theirs, w, label=f"oneDNN {onednn.get('version', '')} bf16, no quantization")
    ax.set_xticks(list(x))
    ax.set_xticklabels([r[0] for r in rows], fontsize=7)
    ax.set_ylabel(f"fraction of the {ref} peak")
    ax.set_ylim(0, max(1.0, max(ours + theirs) * 1.1))
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_title(f"mxfp8 bench: {doc.get('threads', '?')} thread(s), ISA path {doc.get('isa', '?')} "
                 "(MoE: all block rows)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, out, plt)


def plot_quantize(doc, out, plt):
    hist = doc["scale_code_histogram"]
    codes = [c for c in range(len(hist)) if hist[c]]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    if codes:
        lo, hi = min(codes), max(codes)
        xs = list(range(lo, hi + 1))
        a1.bar([c - 127 if c != 255 else hi - 126 for c in xs], [hist[c] for c in xs], 0.9)
    a1.set_xlabel("scale exponent (E8M0 code - 127)")
    a1.set_ylabel("groups")
    a1.set_title(f"scale codes of {doc.get('groups', '?')} groups")
    e = doc["group_rel_err_histogram"]
    edges, counts = e["edges"], e["counts"]
    if counts and sum(counts):
        a2.stairs(counts, edges, fill=True)
        a2.set_xscale("log")
        used = [i for i, c in enumerate(counts) if c]
        a2.set_xlim(edges[max(used[0] - 5, 0)], edges[min(used[-1] + 6, len(edges) - 1)])
    a2.set_xlabel("per-group relative error ||x - dq(q(x))|| / ||x||")
    a2.set_ylabel("groups")
    zero = e.get("exact", 0)
    a2.set_title(f"{doc.get('fmt', '')}, {doc.get('rule', '')} rule: SQNR {doc.get('sqnr_db', float('nan')):.1f} dB"
                 + (f", {zero} groups exact" if zero else ""))
    fig.suptitle(f"mxfp8 quantize {doc.get('input', '')} (axis {doc.get('axis', '?')}, {doc.get('group', '')})",
                 fontsize=9)
    fig.tight_layout()
    _save(fig, out, plt)


def _save(fig, out, plt):
    """Write atomically: a temporary file next to `out`, renamed over it."""
    d = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=".mxfp8-plot-", suffix=os.path.splitext(out)[1] or ".png", dir=d)
    os.close(fd)
    umask = os.umask(0)  # mkstemp makes the file 0600; the image gets the user's normal mode, as open() would
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["check"]:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return NO_MATPLOTLIB
        return 0
    if len(argv) != 3 or argv[0] not in ("bench", "quantize"):
        print(USAGE, file=sys.stderr)
        return 2
    kind, src, out = argv
    plt = _pyplot()
    if plt is None:
        print("mxfp8 plot: error: matplotlib is not installed in this Python (" + sys.executable + "): "
              "pip install matplotlib", file=sys.stderr)
        return NO_MATPLOTLIB
    try:
        with open(src) as f:
            doc = json.load(f)
        (plot_bench if kind == "bench" else plot_quantize)(doc, out, plt)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"mxfp8 plot: error: {src}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
