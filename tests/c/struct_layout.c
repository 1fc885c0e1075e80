/*
 * struct_layout.c -- prints the size, alignment and every field's offset and size of each public struct of mxfp8.h as
 * JSON, as this compiler lays them out. tests/python/test_struct_layout.py runs it (from the build directory) and
 * compares the Python package's ctypes mirrors with it, field for field; that test also checks, from the header
 * itself, that the tables below name every struct and every field. Not a ctest (it checks nothing by itself).
 *
 * Output: {"mxfp8_tensor": {"size": 112, "align": 8, "fields": [["data", 0, 8], ...]}, ...}
 */
#define MXFP8_REFERENCE_API

#include "mxfp8.h"
#include "struct_layout.h"

int main(void) {
    BEGIN(mxfp8_tensor);
    F(mxfp8_tensor, data); F(mxfp8_tensor, dtype); F(mxfp8_tensor, ndim); F(mxfp8_tensor, shape);
    F(mxfp8_tensor, strides);
    END(mxfp8_tensor);
    BEGIN(mxfp8_quant_stats);
    F(mxfp8_quant_stats, elements); F(mxfp8_quant_stats, groups); F(mxfp8_quant_stats, saturated);
    F(mxfp8_quant_stats, flushed_to_zero); F(mxfp8_quant_stats, subnormal); F(mxfp8_quant_stats, nonfinite_groups);
    F(mxfp8_quant_stats, zero_groups); F(mxfp8_quant_stats, scale_histogram); F(mxfp8_quant_stats, sum_sq_error);
    F(mxfp8_quant_stats, sum_sq_signal);
    END(mxfp8_quant_stats);
    BEGIN(mxfp8_quant_params);
    F(mxfp8_quant_params, fmt); F(mxfp8_quant_params, rule); F(mxfp8_quant_params, group);
    F(mxfp8_quant_params, rounding); F(mxfp8_quant_params, seed); F(mxfp8_quant_params, stream);
    F(mxfp8_quant_params, stats);
    END(mxfp8_quant_params);
    BEGIN(mxfp8_kernel_info);
    F(mxfp8_kernel_info, slot); F(mxfp8_kernel_info, kernel); F(mxfp8_kernel_info, isa);
    F(mxfp8_kernel_info, self_test); F(mxfp8_kernel_info, note);
    END(mxfp8_kernel_info);
    BEGIN(mxfp8_info);
    F(mxfp8_info, has_avx512f); F(mxfp8_info, has_avx512bw); F(mxfp8_info, has_avx512vl);
    F(mxfp8_info, has_avx512_bf16); F(mxfp8_info, has_amx_tile); F(mxfp8_info, has_amx_bf16);
    F(mxfp8_info, amx_permitted); F(mxfp8_info, isa); F(mxfp8_info, isa_name); F(mxfp8_info, isa_reason);
    F(mxfp8_info, num_threads); F(mxfp8_info, kernels);
    END(mxfp8_info);
    BEGIN(mxfp8_operand);
    F(mxfp8_operand, values); F(mxfp8_operand, scales); F(mxfp8_operand, scale_layout); F(mxfp8_operand, swizzled);
    F(mxfp8_operand, rounding); F(mxfp8_operand, seed); F(mxfp8_operand, stream); F(mxfp8_operand, stats);
    END(mxfp8_operand);
    BEGIN(mxfp8_matmul_config);
    F(mxfp8_matmul_config, M); F(mxfp8_matmul_config, K); F(mxfp8_matmul_config, N); F(mxfp8_matmul_config, tile_m);
    F(mxfp8_matmul_config, tile_k); F(mxfp8_matmul_config, tile_n); F(mxfp8_matmul_config, tiles_in_block_m);
    F(mxfp8_matmul_config, tiles_in_block_n); F(mxfp8_matmul_config, tiles_in_block_k);
    F(mxfp8_matmul_config, tiles_in_load_m); F(mxfp8_matmul_config, tiles_in_load_n);
    F(mxfp8_matmul_config, block_loop_order); F(mxfp8_matmul_config, tile_loop_order);
    F(mxfp8_matmul_config, float8_dtype); F(mxfp8_matmul_config, enable_scale_packing);
    F(mxfp8_matmul_config, run_with_lnc2); F(mxfp8_matmul_config, lnc_2_shard_rhs);
    F(mxfp8_matmul_config, spill_reload); F(mxfp8_matmul_config, quant_scheme); F(mxfp8_matmul_config, scale_rule);
    F(mxfp8_matmul_config, workspace);
    END(mxfp8_matmul_config);
    BEGIN(mxfp8_matmul_bwd_args);
    F(mxfp8_matmul_bwd_args, output_grad); F(mxfp8_matmul_bwd_args, weights);
    F(mxfp8_matmul_bwd_args, input_activation); F(mxfp8_matmul_bwd_args, input_grad_config);
    F(mxfp8_matmul_bwd_args, weight_grad_config); F(mxfp8_matmul_bwd_args, tile_loop_order);
    F(mxfp8_matmul_bwd_args, float8_dtype); F(mxfp8_matmul_bwd_args, output_dtype);
    F(mxfp8_matmul_bwd_args, run_with_lnc2); F(mxfp8_matmul_bwd_args, lnc_2_shard_rhs);
    F(mxfp8_matmul_bwd_args, output_grad_scales); F(mxfp8_matmul_bwd_args, weight_scales);
    F(mxfp8_matmul_bwd_args, input_scales); F(mxfp8_matmul_bwd_args, use_scale_packing);
    F(mxfp8_matmul_bwd_args, scale_layout); F(mxfp8_matmul_bwd_args, spill_reload);
    F(mxfp8_matmul_bwd_args, output_grad_is_swizzled); F(mxfp8_matmul_bwd_args, weights_is_swizzled);
    F(mxfp8_matmul_bwd_args, input_is_swizzled); F(mxfp8_matmul_bwd_args, scale_rule);
    F(mxfp8_matmul_bwd_args, quant_scheme); F(mxfp8_matmul_bwd_args, workspace);
    F(mxfp8_matmul_bwd_args, output_grad_rounding); F(mxfp8_matmul_bwd_args, weights_rounding);
    F(mxfp8_matmul_bwd_args, input_rounding); F(mxfp8_matmul_bwd_args, rounding_seed); F(mxfp8_matmul_bwd_args, stats);
    END(mxfp8_matmul_bwd_args);
    BEGIN(mxfp8_moe_config);
    F(mxfp8_moe_config, compute_dtype); F(mxfp8_moe_config, quant_dtype); F(mxfp8_moe_config, scale_rule);
    F(mxfp8_moe_config, activation); F(mxfp8_moe_config, affinity_option); F(mxfp8_moe_config, phase1);
    F(mxfp8_moe_config, phase2); F(mxfp8_moe_config, phase3); F(mxfp8_moe_config, phase4);
    F(mxfp8_moe_config, gate_clamp_lower); F(mxfp8_moe_config, gate_clamp_upper); F(mxfp8_moe_config, up_clamp_lower);
    F(mxfp8_moe_config, up_clamp_upper); F(mxfp8_moe_config, skip_token);
    F(mxfp8_moe_config, accumulate_hidden_states_grad); F(mxfp8_moe_config, skip_grad_initialization);
    F(mxfp8_moe_config, single_expert_dense); F(mxfp8_moe_config, bias); F(mxfp8_moe_config, swiglu_alpha);
    F(mxfp8_moe_config, swiglu_limit); F(mxfp8_moe_config, stochastic_rounding); F(mxfp8_moe_config, rounding_seed);
    F(mxfp8_moe_config, shard_option);
    F(mxfp8_moe_config, p3_transpose_mode); F(mxfp8_moe_config, p4_transpose_mode);
    F(mxfp8_moe_config, hidden_states_swizzle_mode); F(mxfp8_moe_config, output_grad_swizzle_mode);
    F(mxfp8_moe_config, weight_swizzle_mode); F(mxfp8_moe_config, skip_weight); F(mxfp8_moe_config, use_fast_dma);
    END(mxfp8_moe_config);
    BEGIN(mxfp8_moe_fwd_args);
    F(mxfp8_moe_fwd_args, hidden_states); F(mxfp8_moe_fwd_args, expert_affinities_masked);
    F(mxfp8_moe_fwd_args, gate_up_proj_weight); F(mxfp8_moe_fwd_args, down_proj_weight);
    F(mxfp8_moe_fwd_args, token_position_to_id); F(mxfp8_moe_fwd_args, block_to_expert);
    F(mxfp8_moe_fwd_args, block_size); F(mxfp8_moe_fwd_args, gate_and_up_proj_bias);
    F(mxfp8_moe_fwd_args, down_proj_bias); F(mxfp8_moe_fwd_args, config);
    F(mxfp8_moe_fwd_args, gate_up_weight_scales); F(mxfp8_moe_fwd_args, down_weight_scales);
    F(mxfp8_moe_fwd_args, num_valid_tokens); F(mxfp8_moe_fwd_args, workspace); F(mxfp8_moe_fwd_args, stats);
    END(mxfp8_moe_fwd_args);
    BEGIN(mxfp8_moe_fwd_outputs);
    F(mxfp8_moe_fwd_outputs, output); F(mxfp8_moe_fwd_outputs, gate_up_proj_act_checkpoint_T);
    F(mxfp8_moe_fwd_outputs, gate_act_checkpoint_T); F(mxfp8_moe_fwd_outputs, intermediate_checkpoint_T);
    F(mxfp8_moe_fwd_outputs, scaled_intermediate_checkpoint_T); F(mxfp8_moe_fwd_outputs, down_proj_output_checkpoint);
    END(mxfp8_moe_fwd_outputs);
    BEGIN(mxfp8_moe_bwd_args);
    F(mxfp8_moe_bwd_args, hidden_states); F(mxfp8_moe_bwd_args, expert_affinities_masked);
    F(mxfp8_moe_bwd_args, gate_up_proj_weight); F(mxfp8_moe_bwd_args, down_proj_weight);
    F(mxfp8_moe_bwd_args, token_position_to_id); F(mxfp8_moe_bwd_args, block_to_expert);
    F(mxfp8_moe_bwd_args, output_hidden_states_grad); F(mxfp8_moe_bwd_args, block_size);
    F(mxfp8_moe_bwd_args, gate_up_proj_act_checkpoint_T); F(mxfp8_moe_bwd_args, gate_act_checkpoint_T);
    F(mxfp8_moe_bwd_args, intermediate_checkpoint_T); F(mxfp8_moe_bwd_args, scaled_intermediate_checkpoint_T);
    F(mxfp8_moe_bwd_args, down_proj_act_checkpoint); F(mxfp8_moe_bwd_args, down_proj_output_checkpoint);
    F(mxfp8_moe_bwd_args, gate_and_up_proj_bias); F(mxfp8_moe_bwd_args, down_proj_bias);
    F(mxfp8_moe_bwd_args, config); F(mxfp8_moe_bwd_args, gate_up_weight_scales);
    F(mxfp8_moe_bwd_args, down_weight_scales); F(mxfp8_moe_bwd_args, num_valid_tokens);
    F(mxfp8_moe_bwd_args, workspace); F(mxfp8_moe_bwd_args, stats);
    END(mxfp8_moe_bwd_args);
    BEGIN(mxfp8_moe_bwd_grads);
    F(mxfp8_moe_bwd_grads, hidden_states_grad); F(mxfp8_moe_bwd_grads, expert_affinities_masked_grad);
    F(mxfp8_moe_bwd_grads, gate_up_proj_weight_grad); F(mxfp8_moe_bwd_grads, down_proj_weight_grad);
    F(mxfp8_moe_bwd_grads, gate_and_up_proj_bias_grad); F(mxfp8_moe_bwd_grads, down_proj_bias_grad);
    END(mxfp8_moe_bwd_grads);
    BEGIN(mxfp8_compare_result);
    F(mxfp8_compare_result, max_abs_golden); F(mxfp8_compare_result, max_abs_err);
    F(mxfp8_compare_result, max_rel_err); F(mxfp8_compare_result, cosine); F(mxfp8_compare_result, norm_euclid);
    F(mxfp8_compare_result, allclose); F(mxfp8_compare_result, num_nan);
    END(mxfp8_compare_result);
    BEGIN(mxfp8_quant_profile);
    F(mxfp8_quant_profile, rule); F(mxfp8_quant_profile, round_toward_zero);
    F(mxfp8_quant_profile, nonfinite_per_element); F(mxfp8_quant_profile, no_saturation);
    F(mxfp8_quant_profile, unsigned_zero);
    END(mxfp8_quant_profile);
    BEGIN(mxfp8_diff_result);
    F(mxfp8_diff_result, groups); F(mxfp8_diff_result, num_profiles); F(mxfp8_diff_result, matched);
    F(mxfp8_diff_result, best); F(mxfp8_diff_result, unexplained); F(mxfp8_diff_result, example);
    F(mxfp8_diff_result, unmatched_by_all);
    END(mxfp8_diff_result);
    printf("\n}\n");
    return 0;
}
