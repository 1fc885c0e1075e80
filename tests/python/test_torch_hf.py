"""mxfp8.torch.hf and convert_to_mxfp8 on Hugging Face transformers (5.x) MoE models, with transformers' own modules
as the oracle: tiny (2-layer) configs of Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, gpt-oss and DeepSeek-V3.

  * the experts module (the "mxfp8" implementation) against an FP64 MX fake-quantization reference written here in
    transformers' fused layouts (quantizing every GEMM operand along its contraction axis, 1x32 groups, as the MoE
    kernels' contract says; the routing blocks from the MoE oracle): output and every gradient (input, routing
    weights, experts' weights and biases) at norm-wise relative error <= 1e-4;
  * the whole model: loss near the unconverted FP32 model's (experts only, and after convert_to_mxfp8), gradient
    cosines, the MoE block alone at cosine >= 0.99; output_router_logits=True and the auxiliary loss; batch sizes
    1, 2 and 3 against each sample alone; state_dict round trips; torch.compile against eager;
  * load_balancing_loss against transformers' load_balancing_loss_func; clear errors for what is not supported.
"""

import copy
import warnings

import numpy as np
import pytest
import torch

import transformers  # noqa: E402  (installed by scripts/setup.sh --test: its absence is a failure)

import mxfp8.torch as mt  # noqa: E402
import mxfp8.torch.hf as mh  # noqa: E402
import moe_oracle  # noqa: E402
import mx_oracle  # noqa: E402
from torch_helpers import cosine  # noqa: E402

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v3")
V, H, I, E, K = 128, 64, 32, 4, 2
BS = 32  # experts' block size in these tests


def tiny_config(family, **over):
    tf = transformers
    c = dict(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
             max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "mixtral":
        cfg = tf.MixtralConfig(**c, intermediate_size=I, num_local_experts=E, num_experts_per_tok=K)
    elif family == "qwen2_moe":
        cfg = tf.Qwen2MoeConfig(**c, intermediate_size=2 * I, moe_intermediate_size=I, num_experts=E,
                                shared_expert_intermediate_size=2 * I, num_experts_per_tok=K)
    elif family == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(**c, intermediate_size=2 * I, moe_intermediate_size=I, num_experts=E,
                                num_experts_per_tok=K, head_dim=32)
    elif family == "olmoe":
        cfg = tf.OlmoeConfig(**c, intermediate_size=I, num_experts=E, num_experts_per_tok=K)
    elif family == "gpt_oss":
        cfg = tf.GptOssConfig(**c, intermediate_size=I, num_local_experts=E, num_experts_per_tok=K, head_dim=32,
                              layer_types=["full_attention"] * 2)
    elif family == "deepseek_v3":
        cfg = tf.DeepseekV3Config(**c, intermediate_size=2 * I, moe_intermediate_size=I, n_routed_experts=E,
                                  num_experts_per_tok=K, n_group=2, topk_group=1, n_shared_experts=1,
                                  first_k_dense_replace=0, kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=16,
                                  qk_nope_head_dim=16, v_head_dim=32, rope_scaling=None)
    else:
        raise ValueError(family)
    for k, v in over.items():
        setattr(cfg, k, v)
    return cfg


def tiny_model(family, seed=0, **over):
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = transformers.AutoModelForCausalLM.from_config(tiny_config(family, **over), experts_implementation="eager")
    m.float()
    if family == "gpt_oss":  # its router starts at zero (all ties): give it weights, as a trained one has
        with torch.no_grad():
            for mod in m.modules():
                if type(mod).__name__ == "GptOssTopKRouter":
                    mod.weight.normal_(0, 0.02)
                    mod.bias.normal_(0, 0.02)
    return m


def experts_modules(model):
    return [m for m in model.modules() if mh.is_experts_module(m)]


def moe_blocks(model):
    return [layer.mlp for layer in model.model.layers]


def tokens(seed, batch=2, seq=16):
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(3, V, (batch, seq), generator=g)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


# ---------------------------------------------------------------------------------------------------------------
# FP64 MX fake-quantization reference of a transformers experts module, written from the layouts and the kernels'
# contract: every GEMM operand is rounded to FP32 and MX-quantized (1x32 groups) along its contraction axis -- H for
# X and the gate/up weights, I for the intermediate and the down weight in the forward; H, the block's positions,
# 2I and the block's positions for the four backward GEMMs (affinity applied on the intermediate).
# ---------------------------------------------------------------------------------------------------------------
def _q(x, axis, quant):
    return moe_oracle.qdq(x, axis, quant)


def hf_weights(experts):
    """(gate [E, I, H], up [E, I, H], down [E, H, I], gate bias [E, I], up bias [E, I], down bias [E, H]) in FP64,
    read from transformers' fused parameters by the layout flags (the meaning documented in transformers)."""
    gu = experts.gate_up_proj.detach().double().numpy()
    dn = experts.down_proj.detach().double().numpy()
    if experts.is_transposed:  # [E, H, 2I] -> [E, 2I, H]; down [E, I, H] -> [E, H, I]
        gu, dn = gu.transpose(0, 2, 1), dn.transpose(0, 2, 1)
    if experts.is_concatenated:
        gate, up = gu[:, :I], gu[:, I:]
    else:
        gate, up = gu[:, 0::2], gu[:, 1::2]
    bg = bu = np.zeros((E, I))
    bd = np.zeros((E, H))
    if experts.has_bias:
        b = experts.gate_up_proj_bias.detach().double().numpy()
        bg, bu = (b[:, :I], b[:, I:]) if experts.is_concatenated else (b[:, 0::2], b[:, 1::2])
        bd = experts.down_proj_bias.detach().double().numpy()
    return gate, up, dn, bg, bu, bd


def act_fwd_bwd(kind, g, u, alpha=1.702, limit=7.0):
    """(inter, d inter/d g, d inter/d u) of the experts' gating in FP64."""
    if kind == "gpt_oss_swiglu":
        alpha, limit = float(np.float32(alpha)), float(np.float32(limit))
        gc, uc = np.minimum(g, limit), np.clip(u, -limit, limit)
        s = 1 / (1 + np.exp(-alpha * gc))
        glu = gc * s
        dglu = (s + alpha * gc * s * (1 - s)) * (g < limit)
        return glu * (uc + 1), dglu * (uc + 1), glu * ((u > -limit) & (u < limit))
    k = {"silu": 1.0, "swish": 1.702}[kind]
    s = 1 / (1 + np.exp(-k * g))
    return g * s * u, (s + k * g * s * (1 - s)) * u, g * s


def reference(experts, x, ids, w, dy, recipe, kind):
    """FP64 forward and backward of experts(x, ids, w) with loss = sum(out * dy): (out [T, H], grads dict with x,
    w, gate, up, down, bias_gate, bias_up, bias_down)."""
    quant = dict(fmt={torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}[recipe.moe_dtype],
                 rule=recipe.scale_rule)
    gate, up, dn, bg, bu, bd = hf_weights(experts)
    alpha, limit = getattr(experts, "alpha", 1.702), getattr(experts, "limit", 7.0)
    X, W, dY = (t.detach().double().numpy() for t in (x, w, dy))
    ids = ids.numpy()
    T = X.shape[0]
    tok, be, a = moe_oracle.route(ids, W, E, BS)
    out = np.zeros((T, H))
    G = dict(x=np.zeros((T, H)), a=np.zeros(T * E), gate=np.zeros((E, I, H)), up=np.zeros((E, I, H)),
             down=np.zeros((E, H, I)), bias_gate=np.zeros((E, I)), bias_up=np.zeros((E, I)), bias_down=np.zeros((E, H)))
    for n in range(len(be)):
        t = tok[n * BS:(n + 1) * BS]
        real = t >= 0
        t = np.where(real, t, 0)
        e = int(be[n])
        xb = np.where(real[:, None], X[t], 0.0)
        dyb = np.where(real[:, None], dY[t], 0.0)
        ab = np.where(real, a[t * E + e], 0.0)
        w1 = np.concatenate([gate[e], up[e]], 0).T  # [H, 2I]
        gu = _q(xb, 1, quant) @ _q(w1, 0, quant)
        g, u = gu[:, :I] + bg[e], gu[:, I:] + bu[e]
        inter, dig, diu = act_fwd_bwd(kind, g, u, alpha, limit)
        inter[~real] = 0.0
        w2 = dn[e].T  # [I, H]
        down = _q(inter, 1, quant) @ _q(w2, 0, quant) + bd[e]
        np.add.at(out, t[real], (ab[:, None] * down)[real])
        # backward
        di_raw = _q(dyb, 1, quant) @ _q(w2.T, 0, quant)
        da = (di_raw * inter).sum(1) + dyb @ bd[e]
        di = ab[:, None] * di_raw
        G["down"][e] += (_q((ab[:, None] * inter).T, 1, quant) @ _q(dyb, 0, quant)).T
        dgu = np.concatenate([di * dig, di * diu], 1)
        dgu[~real] = 0.0
        np.add.at(G["x"], t[real], (_q(dgu, 1, quant) @ _q(w1.T, 0, quant))[real])
        dw1 = _q(xb.T, 1, quant) @ _q(dgu, 0, quant)  # [H, 2I]
        G["gate"][e] += dw1[:, :I].T
        G["up"][e] += dw1[:, I:].T
        G["bias_gate"][e] += dgu[:, :I].sum(0)
        G["bias_up"][e] += dgu[:, I:].sum(0)
        G["bias_down"][e] += (ab[:, None] * dyb)[real].sum(0)
        np.add.at(G["a"], (t * E + e)[real], da[real])
    G["w"] = G.pop("a").reshape(T, E)[np.arange(T)[:, None], ids]
    return out, G


def grads_in_hf_terms(experts):
    """The experts module's parameter gradients split as the reference's (gate, up, down, biases)."""
    gu, dn = experts.gate_up_proj.grad.double().numpy(), experts.down_proj.grad.double().numpy()
    if experts.is_transposed:
        gu, dn = gu.transpose(0, 2, 1), dn.transpose(0, 2, 1)
    sl = (slice(None, I), slice(I, None)) if experts.is_concatenated else (slice(0, None, 2), slice(1, None, 2))
    out = dict(gate=gu[:, sl[0]], up=gu[:, sl[1]], down=dn)
    if experts.has_bias:
        b = experts.gate_up_proj_bias.grad.double().numpy()
        out.update(bias_gate=b[:, sl[0]], bias_up=b[:, sl[1]], bias_down=experts.down_proj_bias.grad.double().numpy())
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_experts_against_fp64_fake_quant_reference(family):
    model = tiny_model(family)
    mh.configure(model, recipe="mxfp8", block_size=BS)
    model.set_experts_implementation("mxfp8")
    experts = experts_modules(model)[0]
    kind = "gpt_oss_swiglu" if family == "gpt_oss" else "silu"
    g = torch.Generator().manual_seed(7)
    T = 40
    x = torch.randn(T, H, generator=g).requires_grad_()
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g).requires_grad_()
    dy = torch.randn(T, H, generator=g)
    if family == "gpt_oss":
        with torch.no_grad():
            for p in experts.parameters():
                p.normal_(0, 0.1)  # biases of the scale of the weights, some gate / up values past the limit
            experts.limit = 0.8
    out = experts(x, ids, w)
    (out * dy).sum().backward()
    ref_out, ref = reference(experts, x, ids, w, dy, mt.get_recipe("mxfp8"), kind)
    assert rel(out.detach(), ref_out) <= 1e-4
    assert rel(x.grad, ref["x"]) <= 1e-4
    assert rel(w.grad, ref["w"]) <= 1e-4
    for name, grad in grads_in_hf_terms(experts).items():
        assert rel(grad, ref[name]) <= 1e-4, name
    # the reference also is what transformers' own eager experts compute, up to the MX error
    model.set_experts_implementation("eager")
    assert cosine(experts(x, ids, w).detach(), torch.from_numpy(ref_out)) > 0.99


def test_quick_gelu_runs_as_the_nki_swish():
    model = tiny_model("mixtral", hidden_act="quick_gelu")
    assert isinstance(experts_modules(model)[0].act_fn, transformers.activations.QuickGELUActivation)
    mh.configure(model, block_size=BS)
    model.set_experts_implementation("mxfp8")
    experts = experts_modules(model)[0]
    g = torch.Generator().manual_seed(3)
    x, ids = torch.randn(24, H, generator=g), torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(24)])
    w, dy = torch.rand(24, K, generator=g), torch.randn(24, H, generator=g)
    ref_out, _ = reference(experts, x, ids, w, dy, mt.get_recipe(mh.DEFAULT_RECIPE), "swish")
    assert rel(experts(x, ids, w).detach(), ref_out) <= 1e-4


def _loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _check_grads(g, g0):
    assert g.keys() == g0.keys()
    flat = lambda d: torch.cat([v.reshape(-1) for v in d.values()])  # noqa: E731
    assert cosine(flat(g), flat(g0)) >= 0.95
    for n in g0:
        lo = 0.6 if ("gate.weight" in n or "router" in n or g0[n].numel() < 64) else 0.85
        assert cosine(g[n], g0[n]) >= lo, n


@pytest.mark.parametrize("family", FAMILIES)
def test_whole_model_loss_gradients_and_router_logits(family):
    model = tiny_model(family)
    ids = tokens(0)
    l0, g0 = _loss_and_grads(model, ids)
    ref_aux = model(ids, labels=ids, output_router_logits=True)
    # experts only
    mh.configure(model, block_size=BS)
    model.set_experts_implementation("mxfp8")
    l1, g1 = _loss_and_grads(model, ids)
    assert abs(l1 - l0) <= 1e-3 * abs(l0)
    _check_grads(g1, g0)
    if family != "deepseek_v3":  # transformers computes no auxiliary loss for DeepSeek-V3
        out = model(ids, labels=ids, output_router_logits=True)
        assert out.aux_loss is not None and torch.isfinite(out.aux_loss)
        assert abs(out.aux_loss.item() - ref_aux.aux_loss.item()) <= 1e-2 * abs(ref_aux.aux_loss.item())
        assert mt.load_balancing_loss(out.router_logits, E, K).item() == pytest.approx(out.aux_loss.item(),
                                                                                        rel=1e-6)
    # the whole model
    model.set_experts_implementation("eager")
    conv, summary = mt.convert_to_mxfp8(model, recipe="mxfp8", block_size=BS, return_summary=True)
    assert conv is model and summary["experts"] and summary["linear"]
    assert any(type(m) is mt.MXFP8Linear for m in model.modules())
    assert model.config._experts_implementation == "mxfp8"
    l2, g2 = _loss_and_grads(model, ids)
    assert abs(l2 - l0) <= 3e-3 * abs(l0)
    _check_grads(g2, g0)


@pytest.mark.parametrize("family", FAMILIES)
def test_moe_block_alone(family):
    """One MoE block with the same routing (the router stays FP32): output, input gradient and parameter
    gradients at cosine >= 0.99 of transformers' eager experts."""
    model = tiny_model(family)
    block = moe_blocks(model)[0]
    x0 = torch.randn(2, 16, H, generator=torch.Generator().manual_seed(5))
    runs = []
    for impl in ("eager", "mxfp8"):
        mh.configure(model, block_size=BS)
        model.set_experts_implementation(impl)
        block.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        y = block(x)
        y = y[0] if isinstance(y, tuple) else y
        y.backward(torch.ones_like(y) + x0)
        runs.append((y.detach(), x.grad, {n: p.grad.clone() for n, p in block.named_parameters()
                                          if p.grad is not None}))
    (y0, dx0, p0), (y1, dx1, p1) = runs
    assert cosine(y1, y0) >= 0.99 and cosine(dx1, dx0) >= 0.99
    assert p1.keys() == p0.keys()
    for n in p0:
        assert cosine(p1[n], p0[n]) >= 0.99, n


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_elements_are_independent(family):
    model = tiny_model(family)
    mt.convert_to_mxfp8(model, block_size=BS)
    model.eval()
    ids = tokens(1, batch=3, seq=12)
    with torch.no_grad():
        alone = [model(ids[i:i + 1]).logits for i in range(3)]
        for b in (1, 2, 3):
            out = model(ids[:b]).logits
            for i in range(b):
                torch.testing.assert_close(out[i:i + 1], alone[i], rtol=1e-5, atol=1e-5)


def test_state_dict_round_trips_and_routers_stay():
    model = tiny_model("qwen2_moe")
    plain = tiny_model("qwen2_moe", seed=1)
    keys = list(model.state_dict())
    mt.convert_to_mxfp8(model, block_size=BS)
    assert list(model.state_dict()) == keys
    # routers and gates keep their precision by default
    assert type(model.model.layers[0].mlp.shared_expert_gate) is torch.nn.Linear
    plain.load_state_dict(model.state_dict())
    for (n, p), q in zip(model.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(p, q), n
    back = tiny_model("qwen2_moe", seed=2)
    mt.convert_to_mxfp8(back, block_size=BS)
    back.load_state_dict(plain.state_dict())
    ids = tokens(2)
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)


def test_blockwise_moe_router_kept_unless_asked():
    moe = torch.nn.Sequential(mt.BlockwiseMoE(64, 32, 4, 2), torch.nn.Linear(64, 64))
    mt.convert_to_mxfp8(moe)
    assert type(moe[0].router) is torch.nn.Linear and type(moe[1]) is mt.MXFP8Linear
    mt.convert_to_mxfp8(moe, quantize_routers=True)
    assert type(moe[0].router) is mt.MXFP8Linear


def test_quantize_routers_warns_for_transformers_routers():
    """transformers' router modules hold raw parameters: quantize_routers=True cannot convert them, and says so."""
    model = tiny_model("mixtral")
    pattern = r"quantize_routers=True, but model\.layers\.[01]\.mlp\.gate \(MixtralTopKRouter\) .* stays in torch"
    with pytest.warns(UserWarning, match=pattern):
        _, summary = mt.convert_to_mxfp8(model, quantize_routers=True, block_size=BS, return_summary=True)
    assert "router" in summary["kept"]["model.layers.0.mlp.gate"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mt.convert_to_mxfp8(tiny_model("mixtral"), block_size=BS)  # the default: kept, no warning


def test_torch_compile_equals_eager():
    model = tiny_model("mixtral")
    mt.convert_to_mxfp8(model, block_size=BS)
    model.eval()
    ids = tokens(3)
    with torch.no_grad():
        eager = model(ids).logits
        compiled = torch.compile(model)(ids).logits
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_load_balancing_loss_equals_transformers():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    g = torch.Generator().manual_seed(11)
    logits = tuple(torch.randn(24, 6, generator=g) for _ in range(3))
    mask = (torch.rand(4, 6, generator=g) > 0.3).long()
    for m in (None, mask):
        want = load_balancing_loss_func(logits, 6, 2, m)
        assert float(mt.load_balancing_loss(logits, 6, 2, m)) == pytest.approx(float(want), rel=1e-6)
    assert mt.load_balancing_loss(None, 6, 2) == 0


def test_unsupported_experts_raise_and_convert_warns():
    model = tiny_model("mixtral", hidden_act="gelu")
    with pytest.warns(UserWarning, match="MixtralExperts.*GELU"):
        _, summary = mt.convert_to_mxfp8(model, return_summary=True)
    assert not summary["experts"] and model.config._experts_implementation == "eager"
    model.set_experts_implementation("mxfp8")
    with pytest.raises(ValueError, match="MixtralExperts: activation"):
        model(tokens(0))
    experts = experts_modules(tiny_model("olmoe"))[0]
    experts.has_gate = False
    with pytest.raises(ValueError, match="OlmoeExperts: experts without a gate"):
        mh.check_experts(experts)
    with pytest.raises(ValueError, match="block_size"):
        mh.configure(experts, block_size=0)


def test_views_share_storage():
    for family in ("mixtral", "gpt_oss"):
        experts = experts_modules(tiny_model(family))[0]
        w1, w2, b1, b2 = mh.experts_views(experts)
        assert w1.shape == (E, H, 2, I) and w2.shape == (E, I, H)
        assert w1.data_ptr() == experts.gate_up_proj.data_ptr() and w2.data_ptr() == experts.down_proj.data_ptr()
        gate, up, dn, bg, bu, bd = hf_weights(experts)
        assert np.array_equal(w1[:, :, 0, :].detach().double().numpy(), gate.transpose(0, 2, 1))
        assert np.array_equal(w1[:, :, 1, :].detach().double().numpy(), up.transpose(0, 2, 1))
        assert np.array_equal(w2.detach().double().numpy(), dn.transpose(0, 2, 1))
        if b1 is not None:
            assert np.array_equal(b1[:, 0].detach().double().numpy(), bg)
            assert np.array_equal(b1[:, 1].detach().double().numpy(), bu)


# ---------------------------------------------------------------------------------------------------------------
# BlockwiseMoE router variants and shared experts, with transformers' routers / blocks as the reference
# ---------------------------------------------------------------------------------------------------------------
def _same_choice(w, ids, w_ref, ids_ref):
    """ids equal as sets per row (bitwise), weights matched by id to FP32 rounding."""
    o, o_ref = torch.sort(ids, dim=-1), torch.sort(ids_ref.long(), dim=-1)
    assert torch.equal(o.values, o_ref.values)
    torch.testing.assert_close(w.float().gather(1, o.indices), w_ref.float().gather(1, o_ref.indices),
                               rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("norm", [True, False])
def test_sigmoid_group_limited_router_matches_deepseek_v3(norm):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    cfg = transformers.DeepseekV3Config(hidden_size=H, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
                                        topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=norm)
    ref = DeepseekV3TopkRouter(cfg)
    g = torch.Generator().manual_seed(21)
    with torch.no_grad():
        ref.weight.normal_(0, 0.2, generator=g)
        ref.e_score_correction_bias.normal_(0, 0.05, generator=g)
    moe = mt.BlockwiseMoE(H, I, 8, 3, score_func="sigmoid", renormalize=norm, score_correction_bias=True,
                          n_group=4, topk_group=2, routed_scaling_factor=2.5, output_router_logits=True)
    with torch.no_grad():
        moe.router.weight.copy_(ref.weight)
        moe.e_score_correction_bias.copy_(ref.e_score_correction_bias)
    x = torch.randn(64, H, generator=g)
    logits_ref, w_ref, ids_ref = ref(x)
    ids, w = moe.route_tokens(x)
    _same_choice(w, ids, w_ref, ids_ref)
    # the correction bias changed some choices (else the test would not see it), without entering the weights
    plain = mt.routing.select_experts(logits_ref, 3, score_func="sigmoid", renormalize=norm, n_group=4,
                                      topk_group=2, routed_scaling_factor=2.5)[1]
    assert not torch.equal(torch.sort(plain, -1).values, torch.sort(ids, -1).values)
    out, logits = moe(x)
    torch.testing.assert_close(logits, logits_ref, rtol=1e-6, atol=1e-6)


def test_router_bias_matches_gpt_oss():
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter

    cfg = transformers.GptOssConfig(hidden_size=H, num_local_experts=E, num_experts_per_tok=K)
    ref = GptOssTopKRouter(cfg)
    g = torch.Generator().manual_seed(22)
    with torch.no_grad():
        ref.weight.normal_(0, 0.2, generator=g)
        ref.bias.normal_(0, 0.5, generator=g)
    moe = mt.BlockwiseMoE(H, I, E, K, router_bias=True)
    with torch.no_grad():
        moe.router.weight.copy_(ref.weight)
        moe.router.bias.copy_(ref.bias)
    x = torch.randn(64, H, generator=g)
    _, w_ref, ids_ref = ref(x)
    ids, w = moe.route_tokens(x)
    _same_choice(w, ids, w_ref, ids_ref)


@pytest.mark.parametrize("norm", [True, False])
def test_softmax_router_and_shared_experts_match_qwen2_moe(norm):
    """Qwen2-MoE's block (softmax router, renormalized or not, a shared expert with its sigmoid gate) and a
    BlockwiseMoE with the same weights: the same routing, outputs at the MXFP8 error, router logits for the
    auxiliary loss."""
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    cfg = tiny_config("qwen2_moe", norm_topk_prob=norm)
    cfg._experts_implementation = "eager"
    torch.manual_seed(23)
    block = Qwen2MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.1)
    moe = mt.BlockwiseMoE(H, I, E, K, renormalize=norm, num_shared_experts=1, shared_intermediate_size=2 * I,
                          shared_expert_gate=True, output_router_logits=True, recipe="mxfp8", block_size=BS)
    gu = block.experts.gate_up_proj.detach()
    with torch.no_grad():
        moe.load_mixtral_weights(block.gate.weight, gu[:, :I], gu[:, I:], block.experts.down_proj)
        for n in ("gate_proj", "up_proj", "down_proj"):
            getattr(moe.shared_experts, n).weight.copy_(getattr(block.shared_expert, n).weight)
        moe.shared_expert_gate.weight.copy_(block.shared_expert_gate.weight)
    x = torch.randn(2, 12, H, generator=torch.Generator().manual_seed(24))
    flat = x.reshape(-1, H)
    logits_ref, w_ref, ids_ref = block.gate(flat)
    ids, w = moe.route_tokens(flat)
    _same_choice(w, ids, w_ref, ids_ref)
    y, logits = moe(x)
    torch.testing.assert_close(logits, logits_ref, rtol=1e-6, atol=1e-6)
    y_ref = block(x)
    assert cosine(y.detach(), y_ref.detach()) >= 0.99
    # without the shared expert the outputs would differ visibly: the test sees it
    assert cosine(y.detach() - moe.shared_experts(flat).reshape(y.shape).detach(), y_ref.detach()) < 0.99
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    want = load_balancing_loss_func((logits_ref,), E, K)
    assert mt.load_balancing_loss(logits, E, K).item() == pytest.approx(want.item(), rel=1e-6)


def test_router_variant_errors():
    with pytest.raises(ValueError, match="score_func"):
        mt.BlockwiseMoE(H, I, E, K, score_func="tanh")
    with pytest.raises(ValueError, match="n_group"):
        mt.BlockwiseMoE(H, I, 6, K, n_group=4)
    with pytest.raises(ValueError, match="topk_group"):
        mt.BlockwiseMoE(H, I, 8, 3, n_group=4, topk_group=1)
    with pytest.raises(ValueError, match="shared_expert_gate"):
        mt.BlockwiseMoE(H, I, E, K, shared_expert_gate=True)
    assert mt.BlockwiseMoE(H, I, E, K, activation="quick_gelu").activation == "swish"


@pytest.mark.parametrize("family", FAMILIES)
def test_from_hf_replaces_the_block_and_to_hf_writes_back(family):
    model = tiny_model(family)
    block = moe_blocks(model)[0]
    moe = mt.BlockwiseMoE.from_hf(block, recipe="mxfp8", block_size=BS)
    x = torch.randn(2, 12, H, generator=torch.Generator().manual_seed(31))
    ref, ours = block(x), moe(x)
    assert type(ours) is type(ref)
    if isinstance(ref, tuple):  # gpt-oss: (output, router_scores)
        assert len(ours) == len(ref) and ours[1].shape == ref[1].shape
        torch.testing.assert_close(torch.sort(ours[1], -1).values, torch.sort(ref[1].float(), -1).values)
        ref, ours = ref[0], ours[0]
    assert ours.shape == ref.shape and cosine(ours.detach(), ref.detach()) >= 0.99
    # the module in the model: the loss stays close to the unconverted model's
    ids = tokens(4)
    with torch.no_grad():
        l0 = float(model(ids, labels=ids).loss)
        model.model.layers[0].mlp = moe
        l1 = float(model(ids, labels=ids).loss)
    assert abs(l1 - l0) <= 3e-3 * abs(l0)
    # to_hf: bitwise round trip into a fresh block
    other = moe_blocks(tiny_model(family, seed=5))[0]
    moe.to_hf(other)
    for (n, p), q in zip(block.state_dict().items(), other.state_dict().values()):
        assert torch.equal(p, q), n


def test_from_hf_rejects_other_blocks():
    with pytest.raises(ValueError, match="Linear is not a supported transformers MoE block"):
        mt.BlockwiseMoE.from_hf(torch.nn.Linear(4, 4))


def test_filter_fn_declines_experts_without_a_warning():
    model = tiny_model("olmoe")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, summary = mt.convert_to_mxfp8(model, filter_fn=lambda m, fqn: not fqn.endswith("experts"),
                                         return_summary=True)
    assert not summary["experts"] and summary["kept"]["model.layers.0.mlp.experts"] == "filter_fn"
    assert model.config._experts_implementation == "eager" and summary["linear"]
