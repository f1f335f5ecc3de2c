// The amax / scale / cast kernels of a torchao Float8Linear (torchao/float8/float8_linear.py,
// matmul_with_hp_or_float8_args): the forward casts the input X [t, in] and the weight W [out, in] to
// float8 e4m3 before the fp8 GEMM (torch._scaled_mm); the backward casts the output grad G [t, out]
// for the dgrad GEMM, W again for it, G again for the wgrad GEMM and X again for it (each call to
// hp_tensor_to_float8_dynamic: tensor_to_amax, amax_to_scale, then _ToFloat8ConstrFunc's scale and
// saturated cast; torchao/float8/float8_utils.py, float8_scaling_utils.py, float8_training_tensor.py).
//
// Recipes (Float8LinearConfig.from_recipe_name, torchao/float8/config.py):
//  * tensorwise: one scale per tensor: amax = max(abs(x)) (aten.max, which torchtitan's SAC policy saves);
//  * rowwise: one scale per row along the GEMM's reduction dim (axiswise): X and G along their last dim
//    in forward / dgrad, along dim 0 for the wgrad GEMM; W along `in` for forward, along `out` for dgrad;
//    amax = amax(abs(x), dim); scales rounded down to powers of 2 (round_scales_to_power_of_2).
// Eager, per cast of E elements of e bytes: abs (read e, write e) and the max (read e); the scale math
// on the amax (to float64, clamp, divide, to float32; rowwise also log2, floor, exp2): tiny kernels;
// the cast: to float32, multiply by the scale, clamp, to float8 (read e, write 4; 4 + 4; 4 + 4; 4 + 1).
// _scaled_mm needs its first operand row-major and its second column-major: in backward the fp8 W (dgrad),
// G transposed and X (wgrad) are copied into that layout (read 1, write 1 per element).
// Compiled (torchtitan requires compile for float8 performance: "torch.compile fuses the float8
// scaling/casting kernels", docs/float8.md): per cast the amax reduction (read e) and one pointwise cast
// kernel computing the scale and writing fp8 in the layout the GEMM needs (read e, write 1); tensorwise
// shares G's amax between its two backward casts (common subexpression); a rowwise cast along the
// contiguous dim is one persistent-reduction kernel (amax and cast of a row together), along dim 0 two.
// Approximations (said in the simulation's notes): inductor's kernel split is assumed, not traced; the
// rowwise GEMM (CUTLASS, scales per row) is timed like the tensorwise cuBLAS one; a bias add is not listed.
#include "models/kernel_builder.h"

namespace fsdpsim::models::detail {
namespace {

struct Cast {
  const char* what;      // "x", "w", "g"
  std::int64_t rows, cols;   // the tensor as stored, [rows, cols], cast along `along_rows` ? cols : rows
  bool along_contiguous;     // rowwise: the amax runs along the contiguous (last) dim
};

// One cast of `count` copies of a [rows, cols] tensor. `amax_shared`: tensorwise G's second cast reuses
// the first's amax (compiled only).
void cast(KernelBuilder& b, const std::string& linear, const Cast& c, std::int64_t count, bool amax_shared) {
  const std::int64_t E = c.rows * c.cols * count;
  const bool rowwise = b.opt.float8 == Float8Recipe::Rowwise;
  const std::int64_t scales = rowwise ? (c.along_contiguous ? c.rows : c.cols) * count : count;
  const std::string p = linear + ".fp8_" + c.what;
  const std::int64_t amax_saved = rowwise ? 0 : count;   // aten.max is in the SAC save list; aten.amax is not
  if (!b.eager()) {
    if (rowwise && c.along_contiguous) {
      b.elementwise(p + "_amax_cast", E * b.e + E + scales * 4, MemoryClass::Copy);
      return;
    }
    if (!amax_shared) b.elementwise(p + "_amax", E * b.e + scales * 4, MemoryClass::Copy, KernelKind::Elementwise, amax_saved);
    b.elementwise(p + "_cast", E * b.e + E + scales * 4, MemoryClass::Copy);
    return;
  }
  b.elementwise(p + "_abs", 2 * E * b.e, MemoryClass::Copy);
  b.elementwise(p + "_max", E * b.e + scales * b.e, MemoryClass::Copy, KernelKind::Elementwise, amax_saved);
  static const char* kScale[] = {"_scale_to_f64", "_scale_clamp", "_scale_div", "_scale_to_f32",
                                 "_scale_log2", "_scale_floor", "_scale_exp2"};
  for (int i = 0; i < (rowwise ? 7 : 4); ++i) b.elementwise(p + kScale[i], scales * 16, MemoryClass::Copy);
  b.elementwise(p + "_to_f32", E * (b.e + 4), MemoryClass::Copy);
  b.elementwise(p + "_mul_scale", E * 8 + scales * 4, MemoryClass::Copy);
  b.elementwise(p + "_clamp", E * 8, MemoryClass::Copy);
  b.elementwise(p + "_to_fp8", E * 5, MemoryClass::Copy);
}

void layout_copy(KernelBuilder& b, const std::string& linear, const char* what, std::int64_t elems) {
  if (b.eager()) b.elementwise(linear + ".fp8_" + what + "_layout", 2 * elems, MemoryClass::Copy);
}

}  // namespace

void KernelBuilder::float8_casts(const std::string& name, std::int64_t t, std::int64_t in, std::int64_t outf,
                                 std::int64_t count, bool wgrad) {
  const bool tensorwise = opt.float8 == Float8Recipe::Tensorwise;
  if (!backward) {
    cast(*this, name, {"x", t, in, true}, count, false);
    cast(*this, name, {"w", outf, in, true}, count, false);
    return;
  }
  // dgrad: G [t, out] along out (contiguous), W [out, in] along out (dim 0 of W).
  cast(*this, name, {"g", t, outf, true}, count, false);
  cast(*this, name, {"w_t", outf, in, false}, count, false);
  layout_copy(*this, name, "w_t", outf * in * count);
  if (!wgrad) return;
  // wgrad: G^T and X along the tokens (dim 0), each copied into the layout _scaled_mm needs in eager.
  cast(*this, name, {"g_t", t, outf, false}, count, tensorwise && !eager());
  layout_copy(*this, name, "g_t", t * outf * count);
  cast(*this, name, {"x_t", t, in, false}, count, false);
  layout_copy(*this, name, "x_t", t * in * count);
}

}  // namespace fsdpsim::models::detail
