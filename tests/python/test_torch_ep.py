"""Tests of expert parallelism in mxfp8.torch (BlockwiseMoE(expert_parallel_group=...), expert_parallel_moe): each
test starts torch_ep_worker.py as P processes joined in a gloo group through a FileStore, every rank computing the
single-process oracle on the gathered batch and comparing its own rows and experts bit for bit.
"""

import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from mxfp8.torch import expert_parallel as ep  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_ep_worker.py")
LIMIT = 240  # seconds for one group of workers (a hang fails the test instead of blocking the suite)


def _env(threads=1):
    env = dict(os.environ)
    import mxfp8
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(mxfp8.__file__))),
                                         env.get("PYTHONPATH", "")])
    env.update(MXFP8_NUM_THREADS=str(threads), OMP_NUM_THREADS="1")
    return env


def _group(tmp_path, P, mode, timeout_s=120, threads=1):
    """Run the P ranks of `mode`; returns ({rank: stdout}, {rank: returncode})."""
    store = str(tmp_path / f"store-{mode}-{P}")
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), str(P), store, mode, str(timeout_s)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(threads))
             for r in range(P)]
    outs, rcs = {}, {}
    try:
        for r, p in enumerate(procs):
            outs[r], _ = p.communicate(timeout=LIMIT)
            rcs[r] = p.returncode
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{mode} at {P} processes did not finish within {LIMIT} s (a hang?):\n" +
                    "\n".join(p.communicate()[0] or "" for p in procs))
    return outs, rcs


def _passed(outs, rcs):
    text = "\n".join(f"--- rank {r}\n{o}" for r, o in outs.items())
    assert all(rc == 0 for rc in rcs.values()) and "FAIL" not in text, text
    return text


def test_expert_range_follows_the_contiguous_rule():
    for E in range(1, 11):
        for P in range(1, E + 1):
            ranges = [ep.expert_range(E, P, r) for r in range(P)]
            assert [first for first, _ in ranges] == [sum(n for _, n in ranges[:r]) for r in range(P)]
            assert sum(n for _, n in ranges) == E
            assert [n for _, n in ranges] == [E // P + 1] * (E % P) + [E // P] * (P - E % P)
    with pytest.raises(ValueError, match="ranks"):
        ep.expert_range(3, 4, 0)
    with pytest.raises(ValueError, match="rank"):
        ep.expert_range(4, 2, 2)


def test_exchange_bytes_model_against_an_enumeration_of_every_routing():
    """The network model against a brute-force average over every top-k choice of a token (all homes, all
    subsets): rows to each distinct other rank, 12 + 4H bytes per remote pair forward, 4(H + 1) backward."""
    import itertools
    for E, K, P, H, wire in ((6, 2, 4, 64, "native"), (5, 3, 2, 40, "mxfp8"), (8, 1, 8, 32, "bf16"),
                             (7, 4, 3, 16, "native")):
        owner = [next(q for q in range(P) if ep.expert_range(E, P, q)[0] <= e < sum(ep.expert_range(E, P, q)))
                 for e in range(E)]
        rb = {"native": 2 * H, "bf16": 2 * H, "mxfp8": H + (H + 31) // 32}[wire]
        subsets = list(itertools.combinations(range(E), K))
        fwd = bwd = 0.0
        for home in range(P):
            for s in subsets:
                rows = len({owner[e] for e in s} - {home})
                pairs = sum(owner[e] != home for e in s)
                fwd += rows * rb + pairs * (12 + 4 * H)
                bwd += rows * rb + pairs * 4 * (H + 1)
        n = P * len(subsets)
        got = ep.exchange_bytes(10, E, K, H, P, wire=wire, dtype=torch.bfloat16)
        assert got["forward"] == pytest.approx(10 * fwd / n + 16 * (P - 1), rel=1e-12)
        assert got["backward"] == pytest.approx(10 * bwd / n, rel=1e-12)


@pytest.mark.parametrize("P,threads", [(1, 1), (2, 1), (3, 2)])
def test_bitwise_equal_to_one_process(tmp_path, P, threads):
    """expert_parallel_moe against route + moe on the gathered batch (all three wires, uneven token counts, ranks
    with no tokens, an expert with no tokens, top-1 to top-4, biases, FP32, the bytes each exchange moves; library
    threads 1 or 2); then BlockwiseMoE(expert_parallel_group=...) against BlockwiseMoE(batch_invariant_router=True)
    on the gathered batch (outputs, input gradients, router logits and their gradients, expert weight gradients), and
    with DistributedDataParallel over the dense parameters; then
    checkpoints from P ranks to one and back. One group of P processes for all of it."""
    text = _passed(*_group(tmp_path, P, "all", threads=threads))
    assert text.count(" ok ") == 18 * P, text
    assert text.count(" ok module") == 6 * P, text
    assert text.count(" ok ckpt") == P, text


def test_bitwise_equal_to_one_process_e6_over_4_ranks(tmp_path):
    """The expert_parallel_moe cases at 4 processes: E = 4, 5 and 6 experts over 4 ranks (6 = 2 + 2 + 1 + 1)."""
    text = _passed(*_group(tmp_path, 4, "bitwise"))
    assert text.count(" ok ") == 11 * 4, text


def _errors(outs):
    """{rank: [error lines in order]}."""
    return {r: re.findall(r"^rank \d+: (.*)$", o, re.M) for r, o in outs.items()}


def test_mismatched_configuration_or_input_fails_on_every_rank_alike(tmp_path):
    """A configuration, an argument or an input that is wrong on one rank (or on all): every rank raises the same
    ExpertParallelError naming the rank and the field, and the layer works afterwards."""
    P = 3
    outs, rcs = _group(tmp_path, P, "mismatch", timeout_s=60)
    text = _passed(outs, rcs)
    errs = _errors(outs)
    assert all(errs[r] == errs[0] for r in errs), text  # the same message on every rank
    want = [f"rank {P - 1} has intermediate_size = 24, rank 0 has 16", f"rank {P - 1} has block_size = 16",
            f"rank {P - 1} has expert_parallel_wire = 'mxfp8'", f"rank {P - 1}: ValueError: top_k",
            f"rank {P - 1} has top_k = 3, rank 0 has 2",
            f"rank {P - 1}: ValueError: hidden_states: last dimension must be hidden_size = 32",
            f"rank {P - 1} has hidden_states_dtype = 'torch.float32', rank 0 has 'torch.bfloat16'",
            "every rank: ValueError: expert_parallel_wire: 'fp4' is not one of 'native', 'bf16', 'mxfp8'",
            "every rank: ValueError: stochastic_rounding: not available with expert parallelism",
            f"every rank: ValueError: expert parallelism: {P} ranks for {P - 1} experts"]
    assert len(errs[0]) == len(want), text
    for line, w in zip(errs[0], want):
        assert line.startswith("error ") and w in line, text


def test_a_rank_that_never_calls_the_layer_times_out_the_others(tmp_path):
    """The group's timeout is the time limit: rank 0 gets an error after about that long, not a hang."""
    timeout_s = 4
    outs, _ = _group(tmp_path, 2, "stall", timeout_s=timeout_s)
    text = "\n".join(outs.values())
    m = re.search(r"rank 0: waited ([\d.]+) s", outs[0])
    assert "rank 0: other error" in outs[0] and "Timed out" in outs[0] and m, text
    assert float(m.group(1)) < 3 * timeout_s, text  # well before the stalled rank itself leaves (4x)


def test_a_rank_that_exits_fails_the_others(tmp_path):
    outs, _ = _group(tmp_path, 2, "crash", timeout_s=60)
    assert "rank 0: other error" in outs[0], outs


def test_without_a_process_group_the_module_is_unchanged():
    import mxfp8.torch as mt
    m = mt.BlockwiseMoE(16, 8, 4, 2)
    assert m.expert_parallel_group is None and m.expert_range == (0, 4)
    assert m.gate_up_proj_weight.shape == (4, 16, 2, 8)
    with pytest.raises(ValueError, match="not initialized"):
        mt.BlockwiseMoE(16, 8, 4, 2, expert_parallel_group=object())


@pytest.mark.parametrize("P", [2, 3])
def test_transformers_experts_split_over_the_group(tmp_path, P):
    """mxfp8.torch.hf.shard_experts: a transformers model's experts (Mixtral's concatenated layout, gpt-oss's
    interleaved one with biases) over P processes, bitwise equal to the unsplit module on the gathered batch."""
    pytest.importorskip("transformers")
    outs, rcs = _group(tmp_path, P, "hf")
    text = _passed(outs, rcs)
    assert text.count("ok hf") == P, text
