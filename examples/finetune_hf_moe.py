#!/usr/bin/env python3
"""Train a small Hugging Face transformers MoE causal LM (built from a config, no download) three times from the same
seed on the same batches -- in torch BF16, and converted with mxfp8.torch.convert_to_mxfp8 to the MXFP8 recipes
"mxfp8" (E4M3, the RCEIL scale rule) and "ocp" (E4M3, the OCP MX v1.0 floor rule) -- and compare the loss curves.

The model is transformers' Mixtral (or --family qwen3_moe / olmoe) with a byte vocabulary (256); the corpus is the
training example's (examples/train_moe_lm.py): the Python standard library's own .py sources, split into training
and validation by file. FP32 master weights, AdamW, torch.autocast(bfloat16) on the CPU, the model's own
load-balancing loss (output_router_logits=True, config.router_aux_loss_coef). In the MXFP8 runs every dense
nn.Linear (attention projections, lm_head) is an MXFP8Linear and the experts run through the "mxfp8" experts
implementation (mxfp8.torch.hf); the routers stay in FP32. The BF16 run uses transformers' eager experts.

The runs train in lockstep (one step of each in turn); tokens/s counts the training steps only.
Writes DIR/loss.csv, DIR/loss.png and DIR/summary.json.

    python examples/finetune_hf_moe.py --steps 120 --out out/finetune_hf_moe
"""

import argparse
import csv
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_moe_lm import load_corpus, lr_at, windows  # noqa: E402  (the same corpus, batches and schedule)

import mxfp8  # noqa: E402
import mxfp8.torch as mt  # noqa: E402

RUNS = ("bf16", "mxfp8", "ocp")


def config(a):
    import transformers as tf

    c = dict(vocab_size=256, hidden_size=a.width, num_hidden_layers=a.layers, num_attention_heads=a.heads,
             num_key_value_heads=a.heads, max_position_embeddings=a.seq, num_experts_per_tok=a.top_k,
             router_aux_loss_coef=a.aux_weight, output_router_logits=True, pad_token_id=0, bos_token_id=1,
             eos_token_id=2, tie_word_embeddings=False)
    if a.family == "mixtral":
        return tf.MixtralConfig(**c, intermediate_size=a.intermediate, num_local_experts=a.experts)
    if a.family == "qwen3_moe":
        return tf.Qwen3MoeConfig(**c, intermediate_size=a.intermediate, moe_intermediate_size=a.intermediate,
                                 num_experts=a.experts, head_dim=a.width // a.heads)
    return tf.OlmoeConfig(**c, intermediate_size=a.intermediate, num_experts=a.experts)


def build(a, run):
    import transformers as tf

    torch.manual_seed(a.seed)
    model = tf.AutoModelForCausalLM.from_config(config(a), experts_implementation="eager").float()
    if run != "bf16":
        _, summary = mt.convert_to_mxfp8(model, recipe=run, block_size=a.block_size, return_summary=True)
        if not summary["experts"]:
            sys.exit(f"finetune_hf_moe: the experts were not converted: {summary['kept']}")
    return model


def losses(model, x, y):
    """(cross-entropy, auxiliary loss) of one batch; the model adds nothing: the loss is computed here."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=x)
    ce = torch.nn.functional.cross_entropy(out.logits.float().reshape(-1, 256), y.reshape(-1))
    return ce, out.aux_loss.float()


@torch.no_grad()
def evaluate(model, batches):
    model.eval()
    v = sum(losses(model, x, y)[0].item() for x, y in batches) / len(batches)
    model.train()
    return v


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--out", default="out/finetune_hf_moe", help="output directory")
    p.add_argument("--runs", default=",".join(RUNS), help="comma-separated: bf16, mxfp8, ocp (default all)")
    p.add_argument("--family", default="mixtral", choices=("mixtral", "qwen3_moe", "olmoe"))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--aux-weight", type=float, default=0.01)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch and mxfp8 threads (default: all cores)")
    a = p.parse_args(argv)
    a.runs = [r.strip() for r in a.runs.split(",") if r.strip()]
    if not a.runs or set(a.runs) - set(RUNS):
        p.error(f"--runs: expected some of {', '.join(RUNS)}, got {','.join(a.runs)!r}")
    for opt in ("steps", "layers", "width", "heads", "experts", "intermediate", "seq", "batch", "block_size",
                "eval_every", "eval_batches"):  # each a usage error here, not a traceback from the model's constructor
        if getattr(a, opt) < 1:
            p.error(f"--{opt.replace('_', '-')} must be >= 1, got {getattr(a, opt)}")
    if a.width % a.heads:
        p.error(f"--width {a.width} must be a multiple of --heads {a.heads}")
    if not 1 <= a.top_k <= a.experts:
        p.error(f"--top-k must be in [1, --experts = {a.experts}], got {a.top_k}")
    if a.threads < 0 or a.warmup < 0:
        p.error(f"--threads and --warmup must be >= 0 (--threads 0: all cores), got {a.threads} and {a.warmup}")
    return a


def plot(a, res, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    colors = {"bf16": "tab:blue", "mxfp8": "tab:orange", "ocp": "tab:green"}
    for n, r in res.items():
        k = max(1, a.steps // 30)
        sm = np.convolve(r["train"], np.ones(k) / k, mode="valid")
        ax.plot(np.arange(k, a.steps + 1), sm, color=colors[n], alpha=0.5, lw=1, label=f"{n} train (mean of {k})")
        s = sorted(r["val"])
        ax.plot(s, [r["val"][i] for i in s], "o-", color=colors[n], ms=3, lw=1.5,
                label=f"{n} validation, {r['tps']:.0f} tokens/s")
    later = [v for r in res.values() for s, v in r["val"].items() if s > 0] or [8.0]
    lo = min(min(r["val"].values()) for r in res.values())
    ax.set_ylim(lo - 0.05, max(later) + 0.3)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/byte)")
    ax.set_title(f"transformers {a.family} ({a.layers} layers, width {a.width}, {a.experts} experts top-{a.top_k}) "
                 f"on the Python stdlib sources, {a.batch}x{a.seq} tokens/step", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "loss.png")


def main(argv=None):
    a = parse_args(argv)
    try:
        import transformers  # noqa: F401
    except ImportError:
        sys.exit("finetune_hf_moe: needs Hugging Face transformers 5 (pip install 'transformers>=5,<6')")
    threads = a.threads or os.cpu_count()
    torch.set_num_threads(threads)
    mxfp8.set_num_threads(threads)
    data, val, _, _ = load_corpus()
    vr = np.random.default_rng(a.seed + 2)
    val_batches = [windows(val, vr.integers(0, len(val) - a.seq - 1, a.batch), a.seq) for _ in range(a.eval_batches)]
    models = {n: build(a, n) for n in a.runs}
    first = next(iter(models.values())).state_dict()
    for m in models.values():
        sd = m.state_dict()
        if sd.keys() != first.keys() or not all(torch.equal(sd[k], first[k]) for k in sd):
            sys.exit("finetune_hf_moe: the runs do not start from the same weights")
    opts = {n: torch.optim.AdamW(m.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
            for n, m in models.items()}
    res = {n: {"train": [], "val": {0: evaluate(m, val_batches)}, "busy": 0.0} for n, m in models.items()}
    rng = np.random.default_rng(a.seed + 1)
    for step in range(1, a.steps + 1):
        x, y = windows(data, rng.integers(0, len(data) - a.seq - 1, a.batch), a.seq)  # the same batch for all
        for n, m in models.items():
            for g in opts[n].param_groups:
                g["lr"] = lr_at(step, a)
            t0 = time.perf_counter()
            ce, aux = losses(m, x, y)
            opts[n].zero_grad(set_to_none=True)
            (ce + a.aux_weight * aux).backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opts[n].step()
            res[n]["busy"] += time.perf_counter() - t0
            res[n]["train"].append(ce.item())
            if not math.isfinite(res[n]["train"][-1]):
                sys.exit(f"finetune_hf_moe: {n} loss is {res[n]['train'][-1]} at step {step}")
            if step % a.eval_every == 0 or step == a.steps:
                res[n]["val"][step] = evaluate(m, val_batches)
        if step % a.eval_every == 0 or step == a.steps:
            print(f"step {step}: " + ", ".join(f"{n} val {r['val'][step]:.4f}" for n, r in res.items()), flush=True)
    for r in res.values():
        r["tps"] = a.steps * a.batch * a.seq / r["busy"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "loss.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step"] + [f"{n}_{k}_loss" for n in res for k in ("train", "val")])
        for step in range(a.steps + 1):
            row = [step]
            for r in res.values():
                row += ["" if step == 0 else f"{r['train'][step - 1]:.6f}",
                        f"{r['val'][step]:.6f}" if step in r["val"] else ""]
            w.writerow(row)
    plot(a, res, out)
    summary = {"family": a.family, "steps": a.steps, "tokens_per_step": a.batch * a.seq, "threads": threads,
               "isa": mxfp8.info()["isa"], "transformers": transformers.__version__}
    for n, r in res.items():
        summary[n] = {"tokens_per_s": round(r["tps"], 1), "final_val_loss": r["val"][a.steps],
                      "final_train_loss": r["train"][-1]}
        print(f"{n:>5}: {r['tps']:8.0f} tokens/s, final validation loss {r['val'][a.steps]:.4f}")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / 'loss.csv'}, {out / 'loss.png'}, {out / 'summary.json'}")
    return summary


if __name__ == "__main__":
    main()
