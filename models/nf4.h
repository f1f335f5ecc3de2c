// QLoRA's 4-bit NormalFloat base weights (plan key lora.quantize_base "nf4"), as torchao stores them and
// torchtune's qlora_* builders use them (torchao/dtypes/nf4tensor.py, read at a584e242 / 0598012; torchtune
// 30b8519 torchtune/modules/low_precision/nf4_linear.py FrozenNF4Linear and peft/lora.py LoRALinear with
// quantize_base: to_nf4(weight) with block_size 64 and scaler_block_size 256).
//
// Storage of an NF4Tensor of N elements (NF4Tensor.from_tensor, double_quantize_scalers,
// convert_to_norm_float_weight): quantized_data, uint8, two 4-bit codes per byte (N / 2 bytes);
// quantized_scalers, int8, one per block of 64 (N / 64); quantization_factor, in the weight's dtype (bf16),
// one per 256 scalers (2 * N / 16384 bytes); plus a 0-d scaler_mean and the 16-entry lookup table (34 bytes per
// weight, left out here). from_tensor asserts N % 64 == 0 and the scalers' count % 256 == 0: N % 16384 == 0.
//
// Under FSDP2 (fsdp_pre_all_gather / fsdp_post_all_gather) a shard is an NF4Tensor of the rank's rows
// (nf4_split splits each inner tensor evenly: rows % W == 0 and N / W % 16384 == 0, or the split asserts),
// the all-gather moves the three inner tensors as bytes (mixed dtypes: FSDP2 gathers a uint8 view), and
// the unsharded parameter is an NF4Tensor again: the quantized bytes, not bf16.
//
// Compute (linear_nf4 -> LinearNF4.forward): F.linear(input, weight.to(input.dtype)) dequantizes the whole
// weight into a new tensor of the compute dtype for the matmul, and the backward does it again for the input's
// gradient (no weight gradient; only the NF4 weight is saved). In eager mode get_original_weight keeps its
// locals alive until torch.stack returns: the two int64 code tensors (N / 2 each: 8 bytes per element), the two
// looked-up halves, the two scaled halves (bf16, N / 2 each) and the stacked output (2 bytes per element):
// 14 bytes per element at its peak, and the flatten copies of the expanded scalers (bf16, N / 2, one at a time)
// on top while each half is scaled. Compiled (inductor), the dequantization is one fused kernel writing the
// output alone, and the compiled block keeps that output for the backward's input gradient instead of
// dequantizing again (measured on PyTorch 2.11: models/block_recipes.cpp linear).
//
// bitsandbytes' layout (FSDP1, the Hugging Face / accelerate and Answer.AI QLoRA path; bitsandbytes
// functional.py quantize_4bit / dequantize_4bit at 8b3c0f3, Params4bit in nn/modules.py): the packed codes are
// the parameter, stored in `bnb_4bit_quant_storage` (the flat parameter's dtype, so that FSDP1 can flatten it:
// N / (2 x its item size) elements, N / 2 bytes); the QuantState is a plain attribute of the module, not a
// parameter, so every rank keeps all of it: with double quantization (bnb_4bit_use_double_quant, the QLoRA
// paper's setting) uint8 absmax per 64 elements (N / 64 bytes), an fp32 absmax per 256 of those (N / 4096 bytes),
// the 256-entry fp32 code of that second level and the 16-entry NF4 code (1088 bytes per weight). The forward
// (MatMul4Bit) dequantizes the absmax into fp32 (N / 16 bytes, freed on return) and the codes in one CUDA kernel
// into a new compute-dtype weight; its backward does it again for the input's gradient.
#pragma once
#include <cstdint>

#include "common/units.h"

namespace fsdpsim::models {

constexpr std::int64_t kNf4BlockSize = 64;          // to_nf4's block_size: one int8 scaler per 64 elements
constexpr std::int64_t kNf4ScalerBlockSize = 256;   // to_nf4's scaler_block_size: one factor per 256 scalers
constexpr std::int64_t kNf4Quantum = kNf4BlockSize * kNf4ScalerBlockSize;   // 16384: N must be a multiple

// Bytes of an NF4Tensor's quantized_data, quantized_scalers and quantization_factor for `numel` elements
// (a multiple of kNf4Quantum), the factor in a 2-byte dtype.
constexpr Bytes nf4_bytes(std::int64_t numel) {
  return numel / 2 + numel / kNf4BlockSize + 2 * (numel / kNf4Quantum);
}

// bitsandbytes: the packed codes' elements in a `storage_bytes`-wide dtype, the QuantState bytes each rank holds
// (double quantization), and the fp32 absmax the dequantization makes first.
constexpr std::int64_t bnb4_packed_numel(std::int64_t numel, Bytes storage_bytes) {
  return (numel + 1) / (2 * storage_bytes);
}
constexpr Bytes bnb4_quant_state_bytes(std::int64_t numel) {
  const std::int64_t blocks = (numel + kNf4BlockSize - 1) / kNf4BlockSize;
  return blocks + 4 * ((blocks + 255) / 256) + 4 * 256 + 4 * 16;
}
constexpr Bytes bnb4_absmax_fp32_bytes(std::int64_t numel) { return 4 * ((numel + kNf4BlockSize - 1) / kNf4BlockSize); }

// The eager dequantization's peak (get_original_weight, above) per element, the output included, and the
// largest of the short-lived copies on top of it: the first half's expanded scalers flattened (N / 2 elements
// of the compute dtype) while the second's scaled half does not exist yet, so 12 + 1 bytes then; the stack
// reaches 14. Compiled: the output only.
constexpr Bytes kNf4EagerDequantPeakPerElem = 14;
// The eager chain's kernels and the HBM bytes each moves, per element of the weight (models/kernels.cpp
// KernelBuilder::linear): per half, the shift or mask (uint8 in and out: 1), the int64 cast (0.5 in, 4 out),
// the table lookup (int64 index in, 2-byte half out: 5), the flatten of the expanded scalers (1 out) and the
// scaling (two halves in, one out: 3); then the stack (2 in, 2 out). 33 bytes per element in 11 kernels
// (dequantize_scalers' kernels work on N / 64 elements: left out). Compiled: one kernel reading the NF4
// bytes and writing the compute dtype.

}  // namespace fsdpsim::models
