// Element types of the runtime's typed buffers: fp32 (master weights, optimizer states, fp32
// reductions; everything on the CPU backend) and bf16 (the CUDA backend's compute and communication).
// Plain C++17: the CUDA kernels' launchers (cuda/kernels.h) use it too.
#pragma once

namespace fsdpsim::runtime {

enum class Elem { F32, BF16 };

inline long elem_size(Elem e) { return e == Elem::F32 ? 4 : 2; }

}  // namespace fsdpsim::runtime
