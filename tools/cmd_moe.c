/*
 * cmd_moe.c -- `mxfp8 moe-bwd`, the project's main job: blockwise_mm_bwd_mxfp8 (NKI blockwise_mm_bwd_mxfp8) on the
 * upstream test problem or on a bundle (moe_inputs.c), checked against the FP64 golden references.
 *
 * Default problem (the upstream test's first shape): (H, T, E, B, TopK, I) = (1024, 1024, 4, 512, 4, 256). The
 * forward (mxfp8_moe_forward) produces the checkpoints and mxfp8_moe_backward the gradients, which are compared
 * with mxfp8_moe_backward_golden: unquantized FP64 (the NKI criteria, information) and quantized FP64 (the verdict).
 * FLOP count: 12 * H * I per routed (token, expert) pair (Phases 1-4: 2HI + 4HI + 4HI + 2HI), padding excluded.
 *
 * The verdict's allowed error (check.h), per gradient against the quantized FP64 reference q:
 *   every element |k - q| <= u |q| + 2^-6 max|q|, and ||k - q||_2 <= (u + 2^-10) ||q||_2,
 * u = half an ulp of the gradients' dtype. Why these: unlike a single GEMM, the layer quantizes intermediates the
 * kernel computed in FP32 (dGU for Phases 2-3, the activation terms), and the reference gets them in FP64 (rounded to
 * FP32 before quantizing). Both agree to FP32 accumulation (about n 2^-24 relative, n <= 2^14 here, so < 2^-10),
 * but an intermediate within that distance of an FP8 rounding boundary, or a group's amax near a power of two, takes
 * the neighbouring code or scale in one of them: a sparse, one-code difference that then moves a few outputs
 * (measured with F32 gradients: 1.3e-4 of max|q| at the default problem, 1.0e-3 at (2048, 8192, 8, 512, 2, 1024);
 * normwise 2.2e-5 and 7.4e-5). The bounds leave a factor 13 or more over that; the normwise one stays a factor 30
 * below MXFP8's own error (about 3e-2), so a wrong block, expert, scale or phase fails.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "memcheck.h"
#include "moe_job.h"
#include "progress.h"

static const cli_nki_criteria k_crit = {0.5, 1e-3, 0.99, 0.70, "allclose: atol = 0.5 x max|golden|, rtol = 1e-3"};
#define MOE_ELEM_TOL 0x1p-6
#define MOE_NORM_TOL 0x1p-10

static void help(void) {
    printf(
        "usage: mxfp8 moe-bwd [--H H --T T --E E --B B --topk K --I I] [--inputs BUNDLE.safetensors]\n"
        "                     [--output GRADS.safetensors] [options]\n\n"
        "The MXFP8 backward of a blockwise Mixture-of-Experts layer (NKI blockwise_mm_bwd_mxfp8), then two checks:\n"
        "  verdict (exit status 1 when it fails): each gradient against the quantized FP64 reference (the same\n"
        "    MXFP8 quantization of every GEMM operand, exact arithmetic), within what FP32 accumulation allows;\n"
        "  information: the NKI pass criteria against the unquantized FP64 golden (allclose(atol = 0.5*max|golden|,\n"
        "    rtol = 1e-3), cosine similarity >= 0.99, ||k - g|| / (||k|| + ||g||) <= 0.70), beside the same criteria\n"
        "    of the quantized reference: MXFP8's own error (tight clamps, for one, can miss them: quantization moves\n"
        "    pre-activations across the clamp limits);\n"
        "and prints the time and TFLOP/s.\n\n"
        "Without --inputs it builds the upstream test problem: (H, T, E, B, TopK, I) = (1024, 1024, 4, 512, 4, 256),\n"
        "W ~ U(-0.1, 0.1), X ~ U(0, 1), dY ~ U(-1, 1) (BF16), TopK distinct experts per token with affinities\n"
        "U(0, 1); routes it (mxfp8_moe_route), runs the forward for the checkpoints, then the backward.\n\n"
        "problem:\n"
        "  --H, --T, --E, --B, --topk, --I N   hidden size, tokens, experts, block size, experts per token,\n"
        "                                       intermediate size\n"
        "  --seed S                             random seed (default 42)\n"
        "  --bias                               the layer has biases b1 [E, 2, I], b2 [E, H] (~ U(-0.1, 0.1));\n"
        "                                       their gradients are checked and written too\n"
        "layer and kernel:\n"
        "  --activation A        act(g) of the gate projection g, which multiplies the up projection u:\n");
    mxfp8_moe_config d;
    mxfp8_moe_config_init(&d);
    const char *gpt_oss = mxfp8_enum_name(MXFP8_ENUM_ACTIVATION, MXFP8_ACT_GPT_OSS_SWIGLU);
    char operands[2][160] = {"", ""}; /* the MoE operand names, the forward's and the backward's GEMMs */
    for (int v = 0, n = mxfp8_enum_count(MXFP8_ENUM_MOE_OPERAND); v < n; v++) {
        char *o = operands[v >= MXFP8_MOE_P1_DY];
        size_t len = strlen(o);
        snprintf(o + len, sizeof operands[0] - len, "%s%s", len ? ", " : "", mxfp8_enum_name(MXFP8_ENUM_MOE_OPERAND, v));
    }
    cli_help_values("                          ", MXFP8_ENUM_ACTIVATION, (int)d.activation);
    printf("  --swiglu-alpha A      %s's alpha (default 1.702)\n"
           "  --swiglu-limit L      %s's limit (default 7; inf: none)\n"
           "  --stochastic-rounding L  GEMM operands rounded stochastically: comma-separated names\n"
           "                        (%s,\n"
           "                        %s),\n"
           "                        gradients (= p1_dy,p2_dgu,p3_dgu,p4_dy), all or none; the check against the\n"
           "                        quantized reference (which rounds to nearest) is then skipped\n"
           "  --rounding-seed S     the seed of stochastic rounding (default 0)\n"
           "  --stats               print the statistics of every GEMM operand of the backward, per expert\n"
           "  --affinity A          where the backward applies the affinity:\n",
           gpt_oss, gpt_oss, operands[0], operands[1]);
    cli_help_values("                          ", MXFP8_ENUM_AFFINITY_OPTION, (int)d.affinity_option);
    printf("  --gate-clamp LO,HI    clamp limits of the gate projection (either may be empty: no limit)\n"
           "  --up-clamp LO,HI      clamp limits of the up projection\n"
           "  --float8-dtype D      %s; the default is the NKI page's\n"
           "  --scale-rule R        %s\n",
           cli_names(MXFP8_ENUM_FLOAT8_DTYPE, NULL, (int)d.quant_dtype),
           cli_names(MXFP8_ENUM_SCALE_RULE, NULL, (int)d.scale_rule));
    printf(
        "  --grad-dtype D        dtype of the gradients: bf16 (default), f32 or f16\n"
        "  --threads N           threads (default: MXFP8_NUM_THREADS, OMP_NUM_THREADS, else all cores)\n"
        "  --repeat R            run the backward R times after one untimed warm-up call, report the best time\n"
        "                        (default 3)\n"
        "files:\n"
        "  --inputs FILE         .safetensors bundle with the NKI parameter names: hidden_states [T, H],\n"
        "                        gate_up_proj_weight [E, H, 2, I], down_proj_weight [E, I, H],\n"
        "                        output_hidden_states_grad [T, H], and routing as either token_position_to_id\n"
        "                        [N*B] + block_to_expert [N(, 1)] + expert_affinities_masked [T*E, 1], or topk_ids\n"
        "                        [T, K] + topk_weights [T, K]; optional: the checkpoints\n"
        "                        (gate_up_proj_act_checkpoint_T, gate_act_checkpoint_T, intermediate_checkpoint_T,\n"
        "                        scaled_intermediate_checkpoint_T, down_proj_act_checkpoint,\n"
        "                        down_proj_output_checkpoint), gate_and_up_proj_bias, down_proj_bias,\n"
        "                        gate_up_weight_scales, down_weight_scales (pre-quantized weights), num_valid_tokens\n"
        "                        (with --single-expert-dense); any other name is an error. Floats BF16, F16 or F32\n"
        "                        (F64 is rounded to F32); integers I32 or I64. Padding id -1, or T (from the ids).\n"
        "  --block-size B        the block size (--B is the same option): the random problem's (default 512),\n"
        "                        or a bundle's when the bundle does not determine it (topk_ids routing)\n"
        "  --single-expert-dense E = 1 identity routing (the NKI dense mode)\n"
        "  --output FILE         write the gradients under the NKI return names to a .safetensors file:\n"
        "                        hidden_states_grad, expert_affinities_masked_grad, gate_up_proj_weight_grad,\n"
        "                        down_proj_weight_grad (+ gate_and_up_proj_bias_grad, down_proj_bias_grad)\n"
        "  --no-check            skip the golden references (just compute and write)\n"
        "  --no-memory-check     run even when the memory the problem needs (estimated before allocating) is\n"
        "                        more than the machine has available\n"
        "  --save-inputs FILE    write the generated problem to a .safetensors bundle (the NKI parameter names,\n"
        "                        explicit routing) that --inputs (or the Python API) can read back\n"
        "  --quiet               no progress line on stderr (shown only when stderr is a terminal)\n"
        "  --expert-parallel     split the job over MPI ranks: mpirun -np P mxfp8 moe-bwd --expert-parallel ...\n"
        "                        (see mxfp8 moe-bwd --expert-parallel --help)\n\n"
        "exit status: 0 ok, 1 the kernel's result is wrong, 2 bad usage, bad input or IO error\n");
}

static const char *const k_grad_names[6] = {"hidden_states_grad",       "expert_affinities_masked_grad",
                                            "gate_up_proj_weight_grad", "down_proj_weight_grad",
                                            "gate_and_up_proj_bias_grad", "down_proj_bias_grad"};
static const char *const k_gdts[] = {"bf16", "f32", "f16"};
static const tf_dtype k_gdt_tf[] = {TF_BF16, TF_F32, TF_F16};

static mxfp8_tensor *grad_slot(mxfp8_moe_bwd_grads *g, int i) {
    switch (i) {
    case 0: return &g->hidden_states_grad;
    case 1: return &g->expert_affinities_masked_grad;
    case 2: return &g->gate_up_proj_weight_grad;
    case 3: return &g->down_proj_weight_grad;
    case 4: return &g->gate_and_up_proj_bias_grad;
    default: return &g->down_proj_bias_grad;
    }
}

static int parse(moe_job *j, const cli_cmdline *cl) {
    const char *cmd = j->cmd;
    const int64_t DMAX = (int64_t)1 << 24;
    j->H = 1024, j->T = 1024, j->E = 4, j->B = 512, j->TOPK = 4, j->I = 256, j->seed = 42, j->repeat = 3;
    mxfp8_moe_config_init(&j->cfg);
    mxfp8_moe_bwd_args_init(&j->ba);
    mxfp8_moe_config *cfg = &j->cfg;
    cfg->quant_dtype = MXFP8_FMT_E4M3;
    if (cli_int(cmd, "H", cli_val(cl, "H"), 1, DMAX, &j->H) || cli_int(cmd, "T", cli_val(cl, "T"), 0, DMAX, &j->T) ||
        cli_int(cmd, "E", cli_val(cl, "E"), 1, 1 << 16, &j->E) || cli_int(cmd, "B", cli_val(cl, "B"), 1, DMAX, &j->B) ||
        cli_int(cmd, "topk", cli_val(cl, "topk"), 1, 1 << 16, &j->TOPK) ||
        cli_int(cmd, "I", cli_val(cl, "I"), 1, DMAX, &j->I) ||
        cli_int(cmd, "seed", cli_val(cl, "seed"), 0, INT64_MAX, &j->seed) ||
        cli_int(cmd, "repeat", cli_val(cl, "repeat"), 1, 1000, &j->repeat) ||
        cli_int(cmd, "block-size", cli_val(cl, "block-size"), 1, DMAX, &j->block_size) ||
        cli_moe_layer(cmd, cl->opts, cl->nopts, cfg) ||
        cli_choice(cmd, "grad-dtype", cli_val(cl, "grad-dtype"), k_gdts, 3, &j->gdt))
        return CLI_USAGE;
    j->act = (int)cfg->activation;
    j->aff = (int)cfg->affinity_option;
    cfg->single_expert_dense = cli_val(cl, "single-expert-dense") != NULL;
    j->f8_given = cli_val(cl, "float8-dtype") != NULL;
    j->in_path = cli_val(cl, "inputs");
    j->out_path = cli_val(cl, "output");
    j->save_path = cli_val(cl, "save-inputs");
    j->check = cli_val(cl, "no-check") == NULL && !cfg->stochastic_rounding; /* the references round to nearest */
    j->quiet = cli_val(cl, "quiet") != NULL;
    j->allow_mem = cli_val(cl, "no-memory-check") != NULL;
    j->stats = cli_val(cl, "stats") != NULL;
    if (j->save_path && j->in_path) return cli_error(cmd, "--save-inputs is for the generated problem, not --inputs");
    static const char *const shape_opts[] = {"H", "T", "E", "topk", "I", "seed"};
    for (int i = 0; j->in_path && i < 6; i++)
        if (cli_val(cl, shape_opts[i]))
            return cli_error(cmd, "--%s sets the random problem; with --inputs the bundle decides", shape_opts[i]);
    /* --block-size and --B are one option (B: the NKI pages' and the other size flags' spelling) */
    const char *bs = cli_val(cl, "block-size"), *b = cli_val(cl, "B");
    if (bs && b && strcmp(bs, b)) return cli_error(cmd, "--B %s and --block-size %s are one option: give one", b, bs);
    if (bs) j->B = j->block_size;
    else if (b) j->block_size = j->B;
    if (!j->in_path && j->TOPK > j->E)
        return cli_error(cmd, "--topk %lld is above --E %lld", (long long)j->TOPK, (long long)j->E);
    if (!j->in_path && cfg->single_expert_dense && j->E != 1) return cli_error(cmd, "--single-expert-dense needs --E 1");
    char err[TF_ERR_LEN];
    if (cli_not_input(cmd, "output", j->out_path, j->in_path)) return CLI_USAGE;
    if (j->out_path && tf_check_writable(j->out_path, 4 + (cfg->bias ? 2 : 0), err, sizeof err))
        return cli_error(cmd, "%s", err);
    if (j->save_path && tf_check_writable(j->save_path, 8, err, sizeof err)) return cli_error(cmd, "%s", err);
    return CLI_OK;
}

/* Routed (token, expert) pairs: the useful work. */
static int64_t routed_pairs(const moe_job *j) {
    int64_t pairs = 0;
    if (j->tpi) {
        const int32_t *ip = j->tpi->data;
        for (int64_t i = 0; i < j->tpi->numel; i++) pairs += ip[i] >= 0 && ip[i] < j->T;
    } else {
        pairs = j->T;
    }
    if (j->ba.num_valid_tokens.data && j->cfg.single_expert_dense) {
        int64_t nv = *(const int32_t *)j->ba.num_valid_tokens.data;
        if (nv < pairs && nv >= 0) pairs = nv;
    }
    return pairs;
}

static void header(const moe_job *j) {
    mxfp8_info info;
    mxfp8_get_info(&info);
    printf("mxfp8 moe-bwd  H=%lld T=%lld E=%lld B=%lld", (long long)j->H, (long long)j->T, (long long)j->E,
           (long long)j->B);
    if (j->routed_topk) printf(" TopK=%lld", (long long)j->TOPK);
    printf(" I=%lld  N=%lld blocks\n", (long long)j->I, (long long)j->N);
    printf("  %s, scale rule %s, %s, %s%s, gradients %s, %d thread%s (%s)\n",
           mxfp8_enum_name(MXFP8_ENUM_FLOAT8_DTYPE, j->cfg.quant_dtype),
           mxfp8_enum_name(MXFP8_ENUM_SCALE_RULE, j->cfg.scale_rule), mxfp8_enum_name(MXFP8_ENUM_ACTIVATION, j->act),
           mxfp8_enum_name(MXFP8_ENUM_AFFINITY_OPTION, j->aff), j->cfg.bias ? ", bias" : "", k_gdts[j->gdt],
           info.num_threads, info.num_threads == 1 ? "" : "s", info.isa_name);
    if (j->in_path) printf("inputs: %s (%s)\n", j->in_path, j->x_f64 ? "F64, rounded to F32" : tf_dtype_name(j->x->dtype));
    else
        printf("inputs: random, seed %lld: W ~ U(-0.1, 0.1), X ~ U(0, 1), dY ~ U(-1, 1), affinities ~ U(0, 1) on "
               "routed pairs (BF16)\n", (long long)j->seed);
    fflush(stdout);
}

/* Forward for the checkpoints (random problem only; a bundle brings its own or lets the backward recompute). */
static int forward(moe_job *j) {
    char err[TF_ERR_LEN];
    mxfp8_moe_fwd_args fa;
    mxfp8_moe_fwd_args_init(&fa);
    mxfp8_moe_bwd_args *ba = &j->ba;
    fa.hidden_states = ba->hidden_states;
    fa.expert_affinities_masked = ba->expert_affinities_masked;
    fa.gate_up_proj_weight = ba->gate_up_proj_weight;
    fa.down_proj_weight = ba->down_proj_weight;
    fa.token_position_to_id = ba->token_position_to_id;
    fa.block_to_expert = ba->block_to_expert;
    fa.block_size = j->B;
    fa.gate_and_up_proj_bias = ba->gate_and_up_proj_bias;
    fa.down_proj_bias = ba->down_proj_bias;
    fa.config = &j->cfg;
    int64_t s_out[2] = {j->T, j->H}, s_ck[4] = {j->N, 2, j->I, j->B}, s_dp[3] = {j->N, j->B, j->H};
    tf_tensor *yo, *ck, *dp = NULL;
    if (!(yo = tf_add_new(&j->work, "output", TF_BF16, 2, s_out, err, sizeof err)) ||
        !(ck = tf_add_new(&j->work, "gate_up_proj_act_checkpoint_T", TF_F32, 4, s_ck, err, sizeof err)) ||
        (j->aff && !(dp = tf_add_new(&j->work, "down_proj_output_checkpoint", TF_F32, 3, s_dp, err, sizeof err))))
        return cli_error(j->cmd, "%s", err);
    mxfp8_moe_fwd_outputs fo;
    memset(&fo, 0, sizeof fo);
    fo.output = tf_view(yo);
    fo.gate_up_proj_act_checkpoint_T = tf_view(ck);
    if (dp) fo.down_proj_output_checkpoint = tf_view(dp);
    cli_progress_next();
    double t0 = cli_now();
    mxfp8_status st = mxfp8_moe_forward(&fa, &fo);
    if (st) return cli_lib_error(j->cmd, "mxfp8_moe_forward", st);
    j->t_fwd = cli_now() - t0;
    ba->gate_up_proj_act_checkpoint_T = fo.gate_up_proj_act_checkpoint_T;
    if (dp) ba->down_proj_output_checkpoint = fo.down_proj_output_checkpoint;
    return CLI_OK;
}

/* Shapes of the gradients (gnd dims each). */
static void grad_shapes(const moe_job *j, int64_t shape[6][4], int gnd[6]) {
    int64_t s[6][4] = {{j->T, j->H}, {j->T * j->E, 1}, {j->E, j->H, 2, j->I}, {j->E, j->I, j->H}, {j->E, 2, j->I},
                       {j->E, j->H}};
    int nd[6] = {2, 2, 4, 3, 3, 2};
    if (j->cfg.single_expert_dense && j->ea->numel == j->T) s[1][0] = j->T;
    if (j->ea->ndim == 1) nd[1] = 1;
    memcpy(shape, s, sizeof s);
    memcpy(gnd, nd, sizeof nd);
}

/* One untimed warm-up call (thread start-up and first touch would otherwise dominate a single timed run), then
 * `repeat` timed calls; the best time. */
static int backward(moe_job *j, mxfp8_moe_bwd_grads *kg) {
    j->best = INFINITY;
    mxfp8_quant_stats *qst = NULL; /* --stats: the warm-up call only (the timed calls run without) */
    if (j->stats && !(j->ba.stats = qst = calloc((size_t)j->E * MXFP8_MOE_NUM_OPERANDS, sizeof *qst)))
        return cli_error(j->cmd, "out of memory for the statistics");
    for (int64_t it = -1; it < j->repeat; it++) {
        cli_progress_next();
        double t0 = cli_now();
        mxfp8_status st = mxfp8_moe_backward(&j->ba, kg);
        if (qst && !st) cli_moe_stats_table(stdout, qst, j->E);
        j->ba.stats = NULL;
        free(qst);
        qst = NULL;
        if (st) return cli_lib_error(j->cmd, "mxfp8_moe_backward", st);
        double t = cli_now() - t0;
        if (it >= 0 && t < j->best) j->best = t;
    }
    for (int i = 0; i < j->grads.n; i++) cli_test_corrupt(j->grads.t[i]);
    return CLI_OK;
}

/* The goldens and the comparisons of every gradient into c[ngr]. */
static int check(moe_job *j, int ngr, cli_grad_check *c) {
    char err[TF_ERR_LEN];
    int64_t gshape[6][4];
    int gnd[6];
    grad_shapes(j, gshape, gnd);
    mxfp8_moe_bwd_grads gg, qg;
    memset(&gg, 0, sizeof gg);
    memset(&qg, 0, sizeof qg);
    for (int i = 0; i < ngr; i++) {
        tf_tensor *g = tf_add_new(&j->gold, k_grad_names[i], TF_F64, gnd[i], gshape[i], err, sizeof err);
        tf_tensor *q = g ? tf_add_new(&j->qref, k_grad_names[i], TF_F64, gnd[i], gshape[i], err, sizeof err) : NULL;
        if (!q) return cli_error(j->cmd, "%s", err);
        *grad_slot(&gg, i) = tf_view(g);
        *grad_slot(&qg, i) = tf_view(q);
    }
    /* The goldens take what the kernel took: a bundle's checkpoints are inputs of the problem. The random problem's
     * come from our own MXFP8 forward (bitwise equal to the backward's recomputation), so there the goldens
     * recompute them: the unquantized one then is the full-precision layer from end to end. */
    mxfp8_moe_bwd_args ga = j->ba;
    if (!j->in_path) {
        memset(&ga.gate_up_proj_act_checkpoint_T, 0, sizeof ga.gate_up_proj_act_checkpoint_T);
        memset(&ga.down_proj_output_checkpoint, 0, sizeof ga.down_proj_output_checkpoint);
    }
    mxfp8_status st;
    cli_progress_next();
    if ((st = mxfp8_moe_backward_golden(&ga, &gg, 0))) return cli_lib_error(j->cmd, "mxfp8_moe_backward_golden", st);
    cli_progress_next();
    if ((st = mxfp8_moe_backward_golden(&ga, &qg, 1)))
        return cli_lib_error(j->cmd, "mxfp8_moe_backward_golden (quantized)", st);
    double u = cli_unit_roundoff(k_gdt_tf[j->gdt]);
    for (int i = 0; i < ngr; i++) {
        tf_tensor *k = j->grads.t[i], *q = j->qref.t[i];
        if (cli_grad_compare(j->cmd, k_grad_names[i], k, j->gold.t[i], q, &k_crit, &c[i])) return CLI_USAGE;
        cli_bound b = {u, MOE_ELEM_TOL * c[i].kernel_vs_qref.max_abs_golden + cli_half_min_subnormal(k->dtype), 0,
                       NULL, NULL, 0, 0, u + MOE_NORM_TOL};
        c[i].ratio = cli_bound_ratio(k, q->data, &b, &c[i].norm_err);
    }
    return CLI_OK;
}

static void bound_text(const moe_job *j, char *buf, size_t len) {
    tf_dtype dt = k_gdt_tf[j->gdt];
    const char *ue = dt == TF_BF16 ? "2^-8" : dt == TF_F16 ? "2^-11" : "2^-24";
    snprintf(buf, len,
             "allowed: |k - ref| <= u |ref| + 2^-6 max|ref| for every element, and ||k - ref|| <= (u + 2^-10) ||ref||;\n"
             "  u = %s = %.2e, half an ulp of the %s gradients (their rounding); 2^-6 and 2^-10: FP32 accumulation\n"
             "  and its one effect that is not small: an FP32 intermediate (dGU, the activation terms) a last bit\n"
             "  away from the reference's may quantize to the neighbouring FP8 code%s", ue, cli_unit_roundoff(dt),
             k_gdts[j->gdt],
             dt == TF_BF16 ? ".\nrel err = max|k - ref| / max|ref|: rounding the gradients to BF16 alone gives up to "
                             "2^-8 = 3.91e-03 in this metric\n  (half an ulp, 2^(e-8), of an element near max|ref| >= "
                             "2^e)" : "");
}

/* The phases of the run, for the progress line. */
static void plan(const moe_job *j, int64_t pairs) {
    double fl = 12.0 * (double)j->H * (double)j->I * (double)(pairs > 0 ? pairs : 1);
    if (!j->in_path) cli_progress_add("forward, for the checkpoints", CLI_WORK_KERNEL, fl / 2);
    cli_progress_add("backward, warm-up", CLI_WORK_KERNEL, fl);
    for (int64_t i = 0; i < j->repeat; i++) cli_progress_add("backward, timed", CLI_WORK_KERNEL, fl);
    if (!j->check) return;
    cli_progress_add("golden reference, unquantized FP64; --no-check skips it", CLI_WORK_GOLDEN, fl);
    cli_progress_add("golden reference, quantized FP64; --no-check skips it", CLI_WORK_GOLDEN, fl);
}

/* The memory the run needs beyond what is loaded (the random problem's inputs when !loaded), estimated from the
 * sizes before anything large is allocated: inputs (BF16) and routing, the forward's F32 checkpoints (random
 * problem), the gradients, the backward's scratch (include/mxfp8.h, Workspace and memory: the FP32 token
 * accumulator, the staging copies of dW1 / dW2, one expert's FP32 weights and packed panels, the FP64 sums), and
 * with the check the goldens' F64 gradients and their own FP64 sums, twice (unquantized and quantized). */
static int memory_check(const moe_job *j, int loaded) {
    int64_t n_blocks = j->N;
    if (!loaded && mxfp8_moe_num_blocks(j->T, j->TOPK, j->E, j->B, &n_blocks)) n_blocks = 0;
    const double T = (double)j->T, H = (double)j->H, E = (double)j->E, I = (double)j->I, NB = (double)n_blocks * j->B;
    const double gs = j->gdt == 1 ? 4.0 : 2.0, grads = T * H + T * E + 3.0 * E * H * I + (j->cfg.bias ? E * (2 * I + H) : 0);
    double need = gs * grads + 4.0 * T * H + (E > 1 ? E - 1 : 0) * 3.0 * H * I * gs + 12.0 * H * I +
                  8.0 * (T * E + 2 * E * I + E * H) + 4.0 * H * (I + 32) + 8.0 * I * (H + 32) + 4.0 * (NB + n_blocks);
    if (!loaded) need += 2.0 * (2.0 * T * H + 3.0 * E * H * I) + 4.0 * T * E + 4.0 * (2.0 * I * NB + NB * H);
    const double chk = j->check ? 2.0 * 2.0 * 8.0 * grads : 0.0;
    return cli_mem_check(j->cmd, need + chk, chk, j->allow_mem);
}

static int run(moe_job *j) {
    char err[TF_ERR_LEN];
    if (j->in_path ? moe_load_bundle(j) || memory_check(j, 1) : memory_check(j, 0) || moe_make_problem(j))
        return CLI_USAGE;
    mxfp8_moe_bwd_args *ba = &j->ba;
    ba->hidden_states = tf_view(j->x);
    ba->expert_affinities_masked = tf_view(j->ea);
    ba->gate_up_proj_weight = tf_view(j->w1);
    ba->down_proj_weight = tf_view(j->w2);
    if (j->tpi) ba->token_position_to_id = tf_view(j->tpi);
    if (j->b2e) ba->block_to_expert = tf_view(j->b2e);
    ba->output_hidden_states_grad = tf_view(j->dy);
    ba->block_size = j->B;
    ba->config = &j->cfg;
    int64_t pairs = routed_pairs(j), gshape[6][4];
    int gnd[6], ngr = j->cfg.bias ? 6 : 4;
    header(j);
    plan(j, pairs);
    j->t_fwd = -1;
    if (!j->in_path && forward(j)) return CLI_USAGE;
    grad_shapes(j, gshape, gnd);
    mxfp8_moe_bwd_grads kg;
    memset(&kg, 0, sizeof kg);
    for (int i = 0; i < ngr; i++) {
        tf_tensor *k = tf_add_new(&j->grads, k_grad_names[i], k_gdt_tf[j->gdt], gnd[i], gshape[i], err, sizeof err);
        if (!k) return cli_error(j->cmd, "%s", err);
        *grad_slot(&kg, i) = tf_view(k);
    }
    if (backward(j, &kg)) return CLI_USAGE;
    cli_grad_check gc[6];
    if (j->check && check(j, ngr, gc)) return CLI_USAGE;
    cli_progress_done();
    double flops = 12.0 * (double)j->H * (double)j->I * (double)pairs;
    printf("\n");
    if (j->t_fwd >= 0) printf("forward (checkpoints): %10.3f ms\n", j->t_fwd * 1e3);
    char blabel[48];
    snprintf(blabel, sizeof blabel, "backward (best of %lld after a warm-up):", (long long)j->repeat);
    printf("%s %.3f ms   %.4g TFLOP/s   (%.3g GFLOP: 12*H*I per routed token-expert pair, %lld pairs)\n", blabel,
           j->best * 1e3, j->best > 0 ? flops / j->best * 1e-12 : 0.0, flops * 1e-9, (long long)pairs);
    if (j->out_path) {
        if (tf_save(j->out_path, &j->grads, err, sizeof err)) return cli_error(j->cmd, "%s", err);
        printf("wrote %d gradients to %s\n", ngr, j->out_path);
    }
    if (!j->check) {
        if (j->cfg.stochastic_rounding)
            printf("verdict: none -- with stochastic rounding there is no reference to judge against (the golden "
                   "references round to nearest)\n");
        return CLI_OK;
    }
    char bt[1024];
    bound_text(j, bt, sizeof bt);
    int rc = cli_print_verdict(gc, ngr, &k_crit, bt);
    cli_golden_hint(j->cmd, j->quiet);
    return rc;
}

int cmd_moe_bwd(int argc, char **argv) {
    for (int i = 1; i < argc; i++) /* the main job over MPI ranks: tools/cmd_moe_ep.c */
        if (!strcmp(argv[i], "--expert-parallel")) return cmd_moe_bwd_ep(argc, argv);
    moe_job j;
    memset(&j, 0, sizeof j);
    j.cmd = "moe-bwd";
    cli_opt opts[] = {
        {"H", 0, 0, NULL},           {"T", 0, 0, NULL},          {"E", 0, 0, NULL},
        {"B", 0, 0, NULL},           {"topk", 0, 0, NULL},       {"I", 0, 0, NULL},
        {"seed", 0, 0, NULL},        CLI_MOE_LAYER_OPTS,         {"grad-dtype", 0, 0, NULL},
        {"threads", 0, 0, NULL},     {"repeat", 0, 0, NULL},     {"inputs", 'i', 0, NULL},
        {"block-size", 0, 0, NULL},  {"single-expert-dense", 0, 1, NULL}, {"output", 'o', 0, NULL},
        {"no-check", 0, 1, NULL},    {"quiet", 'q', 1, NULL},    {"save-inputs", 0, 0, NULL},
        {"stats", 0, 1, NULL},       {"no-memory-check", 0, 1, NULL}};
    cli_cmdline cl;
    int rc = cli_begin(&cl, j.cmd, argc, argv, opts, CLI_COUNT(opts), 0, help);
    if (rc != CLI_CONTINUE || (rc = parse(&j, &cl))) return rc;
    cli_progress_init(j.cmd, !j.quiet);
    rc = run(&j);
    cli_progress_done();
    tf_free(&j.in);
    tf_free(&j.work);
    tf_free(&j.grads);
    tf_free(&j.gold);
    tf_free(&j.qref);
    return rc;
}
