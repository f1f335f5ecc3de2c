// Hand-built StepPrograms for the executor's exact-nanosecond tests: a few lines per op.
#pragma once
#include <string>
#include <vector>

#include "program/step_program.h"

namespace fsdpsim::sim::testing {

// Streams: 0 "default" (compute), 1 "all_gather", 2 "reduce_scatter", 3 "all_reduce", 4 "copy".
class ProgramBuilder {
 public:
  static constexpr int kCompute = 0, kAllGather = 1, kReduceScatter = 2, kAllReduce = 3, kCopy = 4;

  ProgramBuilder() {
    add_stream(StreamRole::Compute, "default");
    add_stream(StreamRole::AllGather, "all_gather");
    add_stream(StreamRole::ReduceScatter, "reduce_scatter");
    add_stream(StreamRole::AllReduce, "all_reduce");
    add_stream(StreamRole::CopyIn, "copy");
  }

  int op(OpKind kind, int stream, std::vector<int> waits = {}, std::string name = "") {
    Op o;
    o.id = static_cast<int>(p.ops.size());
    o.kind = kind;
    o.stream = stream;
    o.waits = std::move(waits);
    o.name = name.empty() ? "op" + std::to_string(o.id) : std::move(name);
    if (kind == OpKind::AllGather || kind == OpKind::ReduceScatter || kind == OpKind::AllReduce) {
      o.group_size = 8;
      o.comm_bytes = 8000;
    }
    p.ops.push_back(std::move(o));
    return p.ops.back().id;
  }
  Op& last() { return p.ops.back(); }
  Op& at(int id) { return p.ops[id]; }

  int buffer(Bytes bytes, MemCategory cat, int pool_stream = 0, bool persistent = false, std::string name = "") {
    Buffer b;
    b.id = static_cast<int>(p.buffers.size());
    b.bytes = bytes;
    b.category = cat;
    b.pool_stream = pool_stream;
    b.persistent = persistent;
    b.name = name.empty() ? "buf" + std::to_string(b.id) : std::move(name);
    p.buffers.push_back(std::move(b));
    return p.buffers.back().id;
  }

  StepProgram p;

 private:
  void add_stream(StreamRole role, const char* name) {
    p.streams.push_back(Stream{static_cast<int>(p.streams.size()), role, name});
  }
};

}  // namespace fsdpsim::sim::testing
