/* cmd_bench.c -- `mxfp8 bench`: options, the order of the sections, the JSON document. See bench.h. */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "plot.h"

static void help(void) {
    printf("usage: mxfp8 bench [quantize|matmul|moe|peak|all] [--threads N] [--json] [--quick] [--reps N] [--full]\n"
           "                   [--plot OUT.png]\n\n"
           "Measures libmxfp8 against this machine's limits, in one run: register-resident peak loops (AMX\n"
           "TDPBF16PS when the CPU and OS allow it, else AVX512-BF16 / FP32 FMA), memcpy bandwidth, and oneDNN's\n"
           "bf16 matmul on the same GEMMs (when built with oneDNN). Every figure is the median of up to N timed runs\n"
           "after a warm-up, and every ratio compares figures of this run. Sections (default all):\n"
           "  quantize  BF16 4096x4096 -> MXFP8 along rows, columns and as rows of 256, 1 and N threads, vs memcpy\n"
           "  matmul    backward and forward at the upstream shapes and 4096^3, vs oneDNN\n"
           "  moe       backward and forward at the upstream, a fine-grained (64 experts), a training step's MoE\n"
           "            layers (width 1024 and 256) and a larger problem, vs oneDNN's GEMMs per block, with the\n"
           "            backward's peak resident memory; then the training step's layers again as mxfp8.torch\n"
           "            runs them (FP32 weights and weight gradients, the FP32 gate/up checkpoint)\n"
           "  peak      the peak loops only (always measured: they are the reference of \"%% of peak\")\n"
           "Rows of matmul and moe are also timed on 1 thread: scaling = time on 1 thread / time on N.\n\n"
           "  --threads N  threads of the calls (default: the library's count)\n"
           "  --json       print one JSON document instead of tables\n"
           "  --quiet      accepted as by every command (bench prints no progress line)\n"
           "  --quick      skip the largest problems (4096^3, the larger MoE), 2 timed runs (quantize and memcpy\n"
           "               always take the median of at least 5)\n"
           "  --reps N     timed runs per item (default 5; fewer when a run is slow; a run over 8 s is timed once)\n"
           "  --full       also run items estimated (from a smaller one in this run) to take over 40 s per run\n"
           "  --plot FILE  also draw the matmul and moe rows (.png, .svg or .pdf): libmxfp8 and oneDNN as fractions\n"
           "               of the peak, side by side (needs matplotlib: python3, or $MXFP8_PYTHON)\n"
           "  mpirun -np P mxfp8 bench moe --expert-parallel: the MoE layer split over MPI ranks (see its --help)\n\n"
           "exit status: 0 ok, 2 bad usage or a failed set-up\n");
}

/* Positional arguments name the sections. */
static int sections(const char *cmd, const cli_cmdline *cl, int *out) {
    static const char *const names[] = {"peak", "quantize", "matmul", "moe", "all"};
    static const int bits[] = {SEC_PEAK, SEC_QUANT, SEC_MATMUL, SEC_MOE, SEC_ALL};
    *out = 0;
    for (int i = 0; i < cl->npos; i++) {
        int k = -1;
        for (int j = 0; j < 5; j++)
            if (!strcmp(cl->pos[i], names[j])) k = j;
        if (k < 0)
            return cli_error(cmd, "unknown section '%s' (one of quantize, matmul, moe, peak, all)", cl->pos[i]);
        *out |= bits[k];
    }
    if (!*out) *out = SEC_ALL;
    return CLI_OK;
}

static void header(bench_ctx *b) {
    const mxfp8_info *in = &b->info;
    cJSON_AddStringToObject(b->root, "library_version", mxfp8_version_string());
    cJSON_AddStringToObject(b->root, "isa", in->isa_name);
    cJSON_AddStringToObject(b->root, "isa_reason", in->isa_reason);
    cJSON_AddNumberToObject(b->root, "threads", b->o.threads);
    cJSON_AddNumberToObject(b->root, "reps", b->o.reps);
    cJSON_AddBoolToObject(b->root, "quick", b->o.quick);
    bench_say(b, "mxfp8 bench -- libmxfp8 %s, ISA path %s (%s), %d thread(s), median of up to %d runs after a warm-up\n",
              mxfp8_version_string(), in->isa_name, in->isa_reason, b->o.threads, b->o.reps);
    bench_say(b, "CPU: AVX-512F %s, AVX512-BF16 %s, AMX-TILE %s, AMX-BF16 %s, AMX permitted by the OS %s\n",
              in->has_avx512f ? "yes" : "no", in->has_avx512_bf16 ? "yes" : "no", in->has_amx_tile ? "yes" : "no",
              in->has_amx_bf16 ? "yes" : "no", in->amx_permitted ? "yes" : "no");
}

int cmd_bench_moe_ep(int argc, char **argv); /* bench_moe_ep.c: `mxfp8 bench moe --expert-parallel` */

int cmd_bench(int argc, char **argv) {
    const char *cmd = "bench";
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--expert-parallel")) return cmd_bench_moe_ep(argc, argv);
    cli_opt opts[] = {{"threads", 0, 0, NULL}, {"json", 0, 1, NULL}, {"quick", 0, 1, NULL},
                      {"reps", 0, 0, NULL},    {"full", 0, 1, NULL},  {"plot", 0, 0, NULL},
                      {"quiet", 'q', 1, NULL}};
    cli_cmdline cl;
    int rc = cli_begin(&cl, cmd, argc, argv, opts, CLI_COUNT(opts), 5, help);
    if (rc != CLI_CONTINUE) return rc;
    bench_ctx b;
    memset(&b, 0, sizeof b);
    bench_opts *o = &b.o;
    int64_t reps = 5;
    if (sections(cmd, &cl, &o->sections) || cli_int(cmd, "reps", cli_val(&cl, "reps"), 1, 4096, &reps))
        return CLI_USAGE;
    o->reps = (int)reps;
    o->json = cli_val(&cl, "json") != NULL;
    o->quick = cli_val(&cl, "quick") != NULL;
    o->full = cli_val(&cl, "full") != NULL;
    o->plot = cli_val(&cl, "plot");
    if (o->plot && cli_plot_check(cmd, o->plot)) return CLI_USAGE;
    o->budget = 4.0;
    o->cold = 8.0;
    o->skip = 40.0;
    if (o->quick && o->reps > 2) o->reps = 2;
    mxfp8_status st = mxfp8_get_info(&b.info);
    if (st != MXFP8_OK) return cli_lib_error(cmd, "mxfp8_get_info", st);
    o->threads = b.info.num_threads; /* --threads, applied by cli_begin, or the library's default */
    if (bench_set_threads(o->threads)) return cli_error(cmd, "cannot use %d threads", o->threads);

    b.root = cJSON_CreateObject();
    if (!b.root) return cli_error(cmd, "out of memory");
    header(&b);
    bench_dnnl_describe(&b);
    bench_peaks_run(&b);
    if (o->sections & SEC_QUANT) bench_quantize(&b);
    if (o->sections & SEC_MATMUL) bench_matmul(&b);
    if (o->sections & SEC_MOE) bench_moe(&b);
    if (o->json) {
        char *s = cJSON_Print(b.root);
        if (s) {
            puts(s);
            free(s);
        }
    }
    rc = CLI_OK;
    if (o->plot && (rc = cli_plot(cmd, "bench", b.root, o->plot)) == CLI_OK && !o->json)
        printf("\nwrote the plot to %s\n", o->plot);
    cJSON_Delete(b.root);
    bench_dnnl_shutdown();
    return rc;
}
