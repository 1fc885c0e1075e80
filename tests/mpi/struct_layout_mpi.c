/*
 * struct_layout_mpi.c -- the public structs of mxfp8_mpi.h as tests/c/struct_layout.c prints those of mxfp8.h: size,
 * alignment and every field's offset and size, as JSON, as this compiler lays them out. Built when CMake finds MPI;
 * tests/python/test_struct_layout.py compares mxfp8.mpi's ctypes mirrors with it and checks the tables below against
 * the header. Makes no MPI call. Not a ctest (it checks nothing by itself).
 */
#include "mxfp8_mpi.h"
#include "../c/struct_layout.h"

int main(void) {
    BEGIN(mxfp8_mpi_moe_stats);
    F(mxfp8_mpi_moe_stats, setup_seconds); F(mxfp8_mpi_moe_stats, dispatch_seconds);
    F(mxfp8_mpi_moe_stats, compute_seconds); F(mxfp8_mpi_moe_stats, combine_seconds);
    F(mxfp8_mpi_moe_stats, dispatch_bytes_sent); F(mxfp8_mpi_moe_stats, dispatch_bytes_received);
    F(mxfp8_mpi_moe_stats, combine_bytes_sent); F(mxfp8_mpi_moe_stats, combine_bytes_received);
    F(mxfp8_mpi_moe_stats, rows_sent); F(mxfp8_mpi_moe_stats, rows_received); F(mxfp8_mpi_moe_stats, local_pairs);
    F(mxfp8_mpi_moe_stats, local_blocks);
    END(mxfp8_mpi_moe_stats);
    BEGIN(mxfp8_mpi_moe_fwd_args);
    F(mxfp8_mpi_moe_fwd_args, comm); F(mxfp8_mpi_moe_fwd_args, num_experts); F(mxfp8_mpi_moe_fwd_args, hidden_states);
    F(mxfp8_mpi_moe_fwd_args, topk_ids); F(mxfp8_mpi_moe_fwd_args, topk_weights);
    F(mxfp8_mpi_moe_fwd_args, expert_affinities_masked); F(mxfp8_mpi_moe_fwd_args, gate_up_proj_weight);
    F(mxfp8_mpi_moe_fwd_args, down_proj_weight); F(mxfp8_mpi_moe_fwd_args, gate_and_up_proj_bias);
    F(mxfp8_mpi_moe_fwd_args, down_proj_bias); F(mxfp8_mpi_moe_fwd_args, gate_up_weight_scales);
    F(mxfp8_mpi_moe_fwd_args, down_weight_scales); F(mxfp8_mpi_moe_fwd_args, block_size);
    F(mxfp8_mpi_moe_fwd_args, config); F(mxfp8_mpi_moe_fwd_args, wire); F(mxfp8_mpi_moe_fwd_args, keep_checkpoints);
    END(mxfp8_mpi_moe_fwd_args);
    BEGIN(mxfp8_mpi_moe_bwd_args);
    F(mxfp8_mpi_moe_bwd_args, context); F(mxfp8_mpi_moe_bwd_args, output_hidden_states_grad);
    F(mxfp8_mpi_moe_bwd_args, gate_up_proj_weight); F(mxfp8_mpi_moe_bwd_args, down_proj_weight);
    F(mxfp8_mpi_moe_bwd_args, gate_and_up_proj_bias); F(mxfp8_mpi_moe_bwd_args, down_proj_bias);
    F(mxfp8_mpi_moe_bwd_args, gate_up_weight_scales); F(mxfp8_mpi_moe_bwd_args, down_weight_scales);
    END(mxfp8_mpi_moe_bwd_args);
    BEGIN(mxfp8_mpi_moe_bwd_grads);
    F(mxfp8_mpi_moe_bwd_grads, hidden_states_grad); F(mxfp8_mpi_moe_bwd_grads, topk_weights_grad);
    F(mxfp8_mpi_moe_bwd_grads, expert_affinities_masked_grad); F(mxfp8_mpi_moe_bwd_grads, gate_up_proj_weight_grad);
    F(mxfp8_mpi_moe_bwd_grads, down_proj_weight_grad); F(mxfp8_mpi_moe_bwd_grads, gate_and_up_proj_bias_grad);
    F(mxfp8_mpi_moe_bwd_grads, down_proj_bias_grad);
    END(mxfp8_mpi_moe_bwd_grads);
    printf("\n}\n");
    return 0;
}
