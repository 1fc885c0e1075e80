/* cmd_info.c -- `mxfp8 info`: library version, CPU features, the ISA path in use and why, the kernel of each slot,
 * thread count. */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

static void help(void) {
    printf("usage: mxfp8 info [--threads N] [--quiet]\n\n"
           "Prints the library version, the CPU features libmxfp8 looks for, the ISA path it chose and why, the\n"
           "kernel of each slot (GEMM, quantize, dequantize) with its self-test result, and the number of threads\n"
           "a call uses.\n\n"
           "options:\n"
           "  --threads N   report as if N threads were requested (default: MXFP8_NUM_THREADS, OMP_NUM_THREADS,\n"
           "                else all cores)\n"
           "  --quiet       accepted as by every command (info prints no notes or progress)\n\n"
           "environment: MXFP8_ISA=scalar|avx512|amx forces an ISA path; MXFP8_NUM_THREADS sets the thread count.\n");
}

int cmd_info(int argc, char **argv) {
    const char *cmd = "info";
    cli_opt opts[] = {{"threads", 0, 0, NULL}, {"quiet", 'q', 1, NULL}};
    cli_cmdline cl;
    int rc = cli_begin(&cl, cmd, argc, argv, opts, CLI_COUNT(opts), 0, help);
    if (rc != CLI_CONTINUE) return rc;
    mxfp8_info in;
    mxfp8_status st = mxfp8_get_info(&in);
    if (st != MXFP8_OK) return cli_lib_error(cmd, "mxfp8_get_info", st);
    const char *env_isa = getenv("MXFP8_ISA");
    const char *env_thr = getenv("MXFP8_NUM_THREADS");
    printf("mxfp8 %s (library %u)\n", mxfp8_version_string(), mxfp8_version_number());
    printf("cpu features:\n");
    for (int i = 0; i < mxfp8_cpu_feature_count(); i++) {
        const char *name = NULL;
        int value = 0;
        st = mxfp8_cpu_feature(i, &name, &value);
        if (st != MXFP8_OK) return cli_lib_error(cmd, "mxfp8_cpu_feature", st);
        printf("  %-14s%s\n", name, value ? "yes" : "no");
    }
    printf("isa path:       %s (%s)\n", in.isa_name ? in.isa_name : "?", in.isa_reason ? in.isa_reason : "");
    printf("MXFP8_ISA:      %s\n", env_isa && *env_isa ? env_isa : "(unset)");
    printf("kernels:\n");
    for (int i = 0; i < MXFP8_NUM_KERNEL_SLOTS; i++) {
        const mxfp8_kernel_info *k = &in.kernels[i];
        printf("  %-10s    %s (%s; %s)\n", k->slot, k->kernel, k->isa,
               k->self_test ? "self-test passed" : "no self-test: reference or exact by construction");
        if (k->note && *k->note) printf("                note: %s\n", k->note);
    }
    const char *env_omp = getenv("OMP_NUM_THREADS");
    int env_nt = 0;
    if (env_thr && *env_thr) { /* the library's rule (include/mxfp8.h): a whole positive integer, clamped */
        char *end = NULL;
        long long v = strtoll(env_thr, &end, 10);
        int digits = 1;
        for (const char *q = env_thr; *q; q++) digits &= *q >= '0' && *q <= '9';
        env_nt = digits && *end == 0 && v >= 1 ? 1 : -1;
        if (env_nt > 0 && (v > MXFP8_MAX_THREADS || end - env_thr > 9)) env_nt = 2;
    }
    if (env_nt == 1) printf("threads:        %d  (MXFP8_NUM_THREADS=%s)\n", in.num_threads, env_thr);
    else if (env_nt == 2)
        printf("threads:        %d  (MXFP8_NUM_THREADS=%s, clamped to %d)\n", in.num_threads, env_thr,
               MXFP8_MAX_THREADS);
    else if (env_nt < 0)
        printf("threads:        %d  (MXFP8_NUM_THREADS=%s is not a positive integer: ignored)\n", in.num_threads,
               env_thr);
    else if (env_omp && *env_omp) printf("threads:        %d  (OMP_NUM_THREADS=%s)\n", in.num_threads, env_omp);
    else printf("threads:        %d\n", in.num_threads);
    return CLI_OK;
}
