// Data types as the plan spells them (fp32/bf16/fp16/fp8), with their sizes.
#pragma once
#include <string>
#include <string_view>

#include "common/units.h"

namespace fsdpsim {

enum class Dtype { FP32, BF16, FP16, FP8 };

constexpr Bytes dtype_bytes(Dtype d) {
  switch (d) {
    case Dtype::FP32: return 4;
    case Dtype::BF16: return 2;
    case Dtype::FP16: return 2;
    case Dtype::FP8: return 1;
  }
  return 4;
}

std::string_view dtype_name(Dtype d);
// Accepts fp32/float32, bf16/bfloat16, fp16/float16, fp8 (+ torch.* spellings); throws InputError(field, s).
Dtype parse_dtype(std::string_view s, const std::string& field);

}  // namespace fsdpsim
