// The module tree of a ModelSpec and the FSDP wrap graph: which modules become FSDP units
// (param groups) under a wrap policy, their parameter counts, and the forward execution order.
// Built on Boost.Graph (module tree = a directed tree, units = a partition of its parameters).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/kernels.h"
#include "models/model_spec.h"

namespace fsdpsim::models {

struct WrapPolicy {
  enum class Kind { TransformerBlock, None, Size, Modules } kind = Kind::TransformerBlock;
  std::int64_t min_num_params = 100'000'000;  // Size: wrap a subtree once it reaches this many params (FSDP1 size_based_auto_wrap_policy)
  std::vector<std::string> modules;           // Modules: module names to wrap, e.g. {"layers.*", "embed_tokens", "lm_head"}
  bool operator==(const WrapPolicy&) const = default;   // (defaulted: every field) sim's wrap-graph cache key
};

// One parameter tensor as PyTorch registers it (shape as nn.Linear stores it: [out, in]; GPT-2's
// Conv1D: [in, out]). The FSDP lowering pads per tensor (FSDP1 use_orig_params alignment, FSDP2 dim-0).
struct ParamTensor {
  std::string name;                 // full dotted name: "model.layers.0.self_attn.q_proj.weight"
  std::vector<std::int64_t> shape;
  std::int64_t numel() const;
};

struct Module {
  std::string name;          // dotted path: "model.layers.3.self_attn"
  std::string type;          // "Embedding", "LlamaDecoderLayer", "Linear", "RMSNorm", ...
  std::int64_t own_params = 0;   // params directly owned (not in children)
  std::int64_t subtree_params = 0;
  int parent = -1;
  std::vector<int> children;
  ModulePart part = ModulePart::Block;
  int layer = -1;            // block index, -1 outside blocks
  std::vector<ParamTensor> params;  // tensors owned directly, in registration order (sum numel = own_params)
  int unit = 0;              // the FSDP unit that all-gathers this module's own params
  int exec_index = 0;        // position in the forward's pre-order call sequence (model = 0)
};

struct FsdpUnit {
  int id = 0;                // 0 = the root unit (always exists; holds what no other unit holds)
  std::string name;          // the wrapped module's name ("" / "root" for the root)
  int module = -1;           // index into WrapGraph::modules
  std::int64_t params = 0;   // parameters this unit all-gathers (excludes nested units)
  std::vector<ModulePart> parts;  // parts whose compute runs under this unit (root: embedding, final norm/head unless wrapped)
  std::vector<int> layers;   // block indices computed under this unit
  bool is_root = false;
  std::vector<ParamTensor> tensors;  // all tensors this unit all-gathers, in registration (named_parameters) order
};

struct WrapGraph {
  std::vector<Module> modules;      // index 0 = the model itself
  std::vector<FsdpUnit> units;      // units[0] = root
  std::vector<int> forward_order;   // unit ids in forward pre-forward order (root first)
  std::int64_t total_params = 0;    // == sum of units[i].params
};

// The module tree alone (WrapGraph::modules with every Module::unit = 0), HF module naming.
// `impl`: the code whose modules hold the parameters (litgpt fuses q, k and v into one linear and registers a
// block's modules in execution order; the others as Hugging Face transformers).
std::vector<Module> build_module_tree(const ModelSpec& m, ModelImpl impl = ModelImpl::HF);
WrapGraph build_wrap_graph(const ModelSpec& m, const WrapPolicy& policy, ModelImpl impl = ModelImpl::HF);
// Parses the CLI form: "block" | "none" | "size:N" | "modules:a,b,..."; InputError(field, text).
WrapPolicy parse_wrap_policy(const std::string& text, const std::string& field);
std::string wrap_policy_name(const WrapPolicy& p);

}  // namespace fsdpsim::models
