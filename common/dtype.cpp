#include "common/dtype.h"

#include "common/errors.h"

namespace fsdpsim {

std::string_view dtype_name(Dtype d) {
  switch (d) {
    case Dtype::FP32: return "fp32";
    case Dtype::BF16: return "bf16";
    case Dtype::FP16: return "fp16";
    case Dtype::FP8: return "fp8";
  }
  return "fp32";
}

Dtype parse_dtype(std::string_view s, const std::string& field) {
  std::string v(s);
  if (v.rfind("torch.", 0) == 0) v = v.substr(6);
  if (v == "fp32" || v == "float32" || v == "float") return Dtype::FP32;
  if (v == "bf16" || v == "bfloat16") return Dtype::BF16;
  if (v == "fp16" || v == "float16" || v == "half") return Dtype::FP16;
  if (v == "fp8" || v == "float8" || v == "float8_e4m3fn") return Dtype::FP8;
  throw InputError(field, "\"" + std::string(s) + "\"", "expected one of fp32, bf16, fp16, fp8");
}

}  // namespace fsdpsim
