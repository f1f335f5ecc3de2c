// Hand-built models and wrap graphs for the lowering tests: tensor shapes chosen so that padding,
// sizes and byte counts can be checked by hand.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model_spec.h"
#include "models/wrap_graph.h"
#include "program/lowering.h"
#include "program/plan.h"

namespace fsdpsim::sim::testing {

using Shapes = std::vector<std::vector<std::int64_t>>;

// A small llama-like spec (the kernels and activation sizes come from models/; the FSDP sizes from
// the hand-written tensor shapes of the graph below).
inline models::ModelSpec tiny_spec(int layers) {
  models::ModelSpec m;
  m.name = "hand";
  m.model_type = "llama";
  m.block_class = "LlamaDecoderLayer";
  m.vocab_size = 64;
  m.hidden = 16;
  m.n_layers = layers;
  m.n_heads = 2;
  m.n_kv_heads = 2;
  m.head_dim = 8;
  m.ffn_hidden = 32;
  m.max_positions = 128;
  return m;
}

inline models::FsdpUnit make_unit(int id, const Shapes& shapes, std::vector<models::ModulePart> parts,
                                  std::vector<int> layers) {
  models::FsdpUnit u;
  u.id = id;
  u.name = id == 0 ? "" : "u" + std::to_string(id);
  u.is_root = id == 0;
  u.parts = std::move(parts);
  u.layers = std::move(layers);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    models::ParamTensor t;
    t.name = u.name + ".p" + std::to_string(i);
    t.shape = shapes[i];
    u.tensors.push_back(t);
    std::int64_t n = 1;
    for (auto d : shapes[i]) n *= d;
    u.params += n;
  }
  return u;
}

// Root = embedding + final norm/head (root_shapes); unit l+1 = block l (block_shapes[l]).
inline models::WrapGraph block_graph(const Shapes& root_shapes, const std::vector<Shapes>& block_shapes) {
  models::WrapGraph g;
  g.units.push_back(make_unit(0, root_shapes, {models::ModulePart::Embedding, models::ModulePart::FinalNormAndHead}, {}));
  for (std::size_t l = 0; l < block_shapes.size(); ++l)
    g.units.push_back(make_unit(static_cast<int>(l) + 1, block_shapes[l], {models::ModulePart::Block},
                                {static_cast<int>(l)}));
  for (const auto& u : g.units) {
    g.forward_order.push_back(u.id);
    g.total_params += u.params;
  }
  return g;
}

// Everything wrapped: a parameter-less root, then embedding, blocks, head as units 1..L+2.
inline models::WrapGraph all_wrapped_graph(const Shapes& embed, const std::vector<Shapes>& blocks, const Shapes& head) {
  models::WrapGraph g;
  g.units.push_back(make_unit(0, {}, {}, {}));
  g.units.push_back(make_unit(1, embed, {models::ModulePart::Embedding}, {}));
  for (std::size_t l = 0; l < blocks.size(); ++l)
    g.units.push_back(make_unit(static_cast<int>(l) + 2, blocks[l], {models::ModulePart::Block}, {static_cast<int>(l)}));
  g.units.push_back(make_unit(static_cast<int>(blocks.size()) + 2, head, {models::ModulePart::FinalNormAndHead}, {}));
  for (const auto& u : g.units) {
    g.forward_order.push_back(u.id);
    g.total_params += u.params;
  }
  return g;
}

inline Plan resolved(const std::string& plan_json, int gpus, int gpn) {
  return resolve_plan(parse_plan(nlohmann::json::parse(plan_json)), gpus, gpn);
}

inline StepProgram lower_hand(const models::WrapGraph& g, const std::string& plan_json, int gpus, int gpn,
                              int layers = 2) {
  Plan p = resolved(plan_json, gpus, gpn);
  return lower(tiny_spec(layers), g, p, Topology{gpus, gpn});
}

// ---- queries on a program ----
inline std::vector<const Op*> ops_of(const StepProgram& p, OpKind k, int unit = -2) {
  std::vector<const Op*> r;
  for (const auto& o : p.ops)
    if (o.kind == k && (unit == -2 || o.unit == unit)) r.push_back(&o);
  return r;
}

inline const Buffer* buffer_named(const StepProgram& p, const std::string& name) {
  for (const auto& b : p.buffers)
    if (b.name == name) return &b;
  return nullptr;
}

inline Bytes persistent_bytes(const StepProgram& p, MemCategory c) {
  Bytes s = 0;
  for (const auto& b : p.buffers)
    if (b.persistent && b.category == c) s += b.bytes;
  return s;
}

// Every buffer of a category, persistent or not (the sharded gradients live from their reduction to
// the step's end).
inline Bytes category_bytes(const StepProgram& p, MemCategory c) {
  Bytes s = 0;
  for (const auto& b : p.buffers)
    if (b.category == c) s += b.bytes;
  return s;
}
// The buffers an op allocates / frees of one category.
inline std::vector<int> allocs_of(const StepProgram& p, const Op& o, MemCategory c) {
  std::vector<int> r;
  for (int b : o.allocs)
    if (p.buffers[b].category == c) r.push_back(b);
  return r;
}
inline std::vector<FreeSpec> frees_of(const StepProgram& p, const Op& o, MemCategory c) {
  std::vector<FreeSpec> r;
  for (const FreeSpec& f : o.frees)
    if (p.buffers[f.buffer].category == c) r.push_back(f);
  return r;
}
inline Bytes alloc_bytes(const StepProgram& p, const Op& o, MemCategory c) {
  Bytes s = 0;
  for (int b : allocs_of(p, o, c)) s += p.buffers[b].bytes;
  return s;
}

inline std::string stream_name(const StepProgram& p, const Op& o) { return p.streams[o.stream].name; }

// "kind@stream" for each op of `unit` (in issue order), e.g. "all_gather@unshard".
inline std::vector<std::string> sequence(const StepProgram& p, int unit, int micro_batch = 0) {
  std::vector<std::string> r;
  for (const auto& o : p.ops)
    if (o.unit == unit && o.micro_batch == micro_batch)
      r.push_back(std::string(op_kind_name(o.kind)) + "@" + p.streams[o.stream].name);
  return r;
}

inline bool waits_on(const Op& o, int id) { return std::find(o.waits.begin(), o.waits.end(), id) != o.waits.end(); }

inline bool frees(const Op& o, int buffer) {
  for (const auto& f : o.frees)
    if (f.buffer == buffer) return true;
  return false;
}

}  // namespace fsdpsim::sim::testing
