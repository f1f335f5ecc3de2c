// What an optimizer keeps per parameter tensor it steps, and what its step moves (plan key `optimizer`).
//
// torch.optim's AdamW and SGD keep each state in the parameter's dtype (zeros_like in _init_group). The
// low-bit and paged AdamWs, read from their sources:
//  * bitsandbytes (bitsandbytes/optim/optimizer.py at 06029dd, Optimizer2State.init_state, get_state_buffer,
//    step): 8-bit states are uint8 codes, one byte per element, with a float32 absmax per block of 2048
//    elements (block_wise, the default); a tensor under min_8bit_size (4096) elements keeps float32 states.
//    32-bit states are float32 whatever the parameter's dtype. A paged optimizer allocates every state buffer
//    of at least 1e5 elements with F.get_paged (cudaMallocManaged: unified memory, outside PyTorch's caching
//    allocator), the absmax tensors with torch.zeros. The state is created at the first step; the step runs
//    one CUDA kernel per tensor and calls torch.cuda.synchronize() after each.
//  * torchao (torchao/optim/adam.py, subclass_8bit.py, subclass_4bit.py at 36027d8; _AdamBase._new_buffer):
//    a tensor whose local (per-rank) element count is at least 4096 and a multiple of the block size gets an
//    OptimState8bit (uint8 codes, one per element, a float32 scale per block of 256, a 256-entry float32 qmap)
//    or OptimState4bit (codes packed two per byte, a float32 scale per block of 128, a 16-entry qmap);
//    others a plain zeros_like of the parameter. The step is single_param_adam compiled per tensor (fused:
//    the float32 copies live in registers).
#pragma once
#include <cstdint>
#include <string>

#include "common/units.h"
#include "program/plan.h"

namespace fsdpsim::sim {

inline constexpr std::int64_t kBnbMin8bitSize = 4096;       // min_8bit_size default (and the 4096 floor)
inline constexpr std::int64_t kBnbBlock = 2048;             // blockwise absmax block
inline constexpr std::int64_t kBnbPagedMinNumel = 100000;   // get_state_buffer: paged when numel >= 1e5
inline constexpr std::int64_t kTorchaoMinNumel = 4096;      // _new_buffer: quantized when numel >= 4096
inline constexpr std::int64_t kTorchao8bitBlock = 256;
inline constexpr std::int64_t kTorchao4bitBlock = 128;

int optimizer_state_count(Optimizer o);   // 1 for SGD's momentum, 2 for every AdamW
bool optimizer_is_bitsandbytes(Optimizer o);
bool optimizer_is_torchao(Optimizer o);
bool optimizer_is_low_bit(Optimizer o);   // neither torch.optim's AdamW nor SGD
bool optimizer_is_paged(Optimizer o);
// The class a training script constructs ("torch.optim.AdamW", "bitsandbytes.optim.PagedAdamW8bit", ...).
std::string optimizer_class(Optimizer o);
// Why plan `p`'s optimizer is not modelled with the rest of the plan, or "" when it is: a low-bit or paged optimizer
// in the bundled runtime or with CPU offload, bitsandbytes' over FSDP2's DTensor parameters. The lowering refuses
// such a plan; the planner's search leaves it out; diagnose keeps torch.optim's AdamW instead.
std::string optimizer_not_modelled(const Plan& p);

// One state of a tensor of `numel` elements (local to the rank) whose parameter holds `param_bytes` per
// element: its bytes on the device, through PyTorch's allocator (codes or values, and the block scales as
// their own tensors), and in paged unified memory.
struct OptimizerStateBytes {
  Bytes values = 0;   // the state's values or codes through PyTorch's allocator
  Bytes scales = 0;   // bitsandbytes' absmax / torchao's scale and qmap (a separate tensor; 0: none)
  Bytes paged = 0;    // the values in CUDA unified memory instead (paged optimizers)
  Bytes total() const { return values + scales + paged; }
};
OptimizerStateBytes optimizer_state_bytes(Optimizer o, std::int64_t numel, Bytes param_bytes);
// Bytes one step reads and writes for such a tensor: the parameter (read, write), its gradient (read, in
// the parameter's dtype) and every state (read, write).
Bytes optimizer_step_bytes(Optimizer o, std::int64_t numel, Bytes param_bytes);
// A lower bound on a state's bytes on the device through PyTorch's allocator for `numel` elements in all,
// whatever their split into tensors (planner bounds): the fewest bytes per element any tensor gets.
Bytes optimizer_state_lower_bound(Optimizer o, std::int64_t numel, Bytes param_bytes);

}  // namespace fsdpsim::sim
