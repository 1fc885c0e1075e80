/*
 * main.c -- the `mxfp8` command-line tool: subcommand dispatch.
 *
 * Every command answers --help and exits 0 on success, 1 when a verdict fails (a kernel result is wrong), and 2 on
 * bad usage, bad input or an IO error (one line "mxfp8 <command>: error: ..." on stderr). Built on include/mxfp8.h
 * only.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct {
    const char *name;
    cli_command_fn fn;
    const char *summary;
} command;

static const command k_commands[] = {
    {"quantize", cmd_quantize, "MX-quantize a .npy/.safetensors tensor along an axis -> data + scales"},
    {"dequantize", cmd_dequantize, "dequantize data + scales back to F32, BF16 or F16"},
    {"matmul-bwd", cmd_matmul_bwd, "MXFP8 backward of a linear layer (NKI matmul_mxfp8_backward), checked"},
    {"moe-bwd", cmd_moe_bwd, "MXFP8 blockwise MoE backward (NKI blockwise_mm_bwd_mxfp8), checked: the main job"},
    {"info", cmd_info, "version, CPU features, the ISA path chosen and why, threads"},
    {"diff", cmd_diff, "explain another stack's MXFP8 bits: the profile that reproduces them, unexplained groups"},
    {"bench", cmd_bench, "speed against this machine's peaks and oneDNN (GB/s, TFLOP/s, % of peak)"},
};

static void usage(FILE *f) {
    fprintf(f,
            "mxfp8 %s -- MXFP8 training kernels for CPUs (OCP MX v1.0; AWS NKI matmul_mxfp8_backward and\n"
            "blockwise_mm_bwd_mxfp8)\n\n"
            "usage: mxfp8 <command> [options]     (mxfp8 <command> --help for a command's options)\n\n"
            "commands:\n",
            mxfp8_version_string());
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(f, "  %-12s %s\n", k_commands[i].name, k_commands[i].summary);
    fprintf(f, "\nexit status: 0 ok, 1 a kernel result is wrong (matmul-bwd, moe-bwd), 2 bad usage, bad input or IO "
               "error\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "-h") || !strcmp(name, "--help") || !strcmp(name, "help")) {
        if (!strcmp(name, "help") && argc > 2) {
            /* mxfp8 help CMD == mxfp8 CMD --help */
            char *sub[3] = {argv[2], "--help", NULL};
            for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
                if (!strcmp(argv[2], k_commands[i].name)) return k_commands[i].fn(2, sub);
            fprintf(stderr, "mxfp8: error: unknown command '%s' (see mxfp8 --help)\n", argv[2]);
            return CLI_USAGE;
        }
        usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(name, "-V") || !strcmp(name, "--version")) {
        printf("mxfp8 %s\n", mxfp8_version_string());
        return CLI_OK;
    }
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (!strcmp(name, k_commands[i].name)) return k_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "mxfp8: error: unknown command '%s' (see mxfp8 --help)\n", name);
    return CLI_USAGE;
}
