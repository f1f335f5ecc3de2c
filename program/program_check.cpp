// validate_program (program/program_check.h): the structural checks a StepProgram must pass before either
// executor runs it. Every dependency must point to an earlier op in issue order; with that, the
// program's dependency graph is acyclic and the executor can never deadlock (the earliest
// unfinished op always has all its dependencies complete or issuable).
#include <stdexcept>
#include <string>

#include "common/errors.h"
#include "program/program_check.h"

namespace fsdpsim::sim {

namespace {

std::string op_field(std::size_t i, const std::string& what) {
  return "program.ops[" + std::to_string(i) + "]." + what;
}

}  // namespace

namespace detail {

namespace {

// Buffer b's checks, in order; throws the first that fails.
void check_buffer(const StepProgram& p, int b, int n_streams) {
  const Buffer& buf = p.buffers[b];
  auto f = [b] { return "program.buffers[" + std::to_string(b) + "]"; };
  if (buf.id != b) throw InputError(f() + ".id", std::to_string(buf.id), "the buffer's index " + std::to_string(b));
  if (buf.bytes < 0) throw InputError(f() + ".bytes", std::to_string(buf.bytes), ">= 0");
  if (buf.pool_stream < 0 || buf.pool_stream >= n_streams)
    throw InputError(f() + ".pool_stream", std::to_string(buf.pool_stream),
                     "a stream id in [0, " + std::to_string(n_streams) + ")");
  int c = static_cast<int>(buf.category);
  if (c < 0 || c >= kNumMemCategories || buf.category == MemCategory::AllocatorSlack ||
      buf.category == MemCategory::CudaContext)
    throw InputError(f() + ".category", std::to_string(c), "a buffer category (not allocator_slack/cuda_context)");
  if (buf.first_step_lazy && !buf.persistent)
    throw InputError(f() + ".first_step_lazy", "true", "only on a persistent buffer");
  if (buf.after_construction && (!buf.persistent || buf.first_step_lazy))
    throw InputError(f() + ".after_construction", "true", "only on a persistent buffer that is not first_step_lazy");
  if (buf.init_originals != -1 &&
      (static_cast<unsigned>(buf.init_originals) >= p.init_originals.size() || !buf.persistent || buf.first_step_lazy ||
       buf.category != MemCategory::ShardedParams))
    throw InputError(f() + ".init_originals", std::to_string(buf.init_originals),
                     "-1, or an index into program.init_originals (" + std::to_string(p.init_originals.size()) +
                         " lists) on a persistent sharded_params buffer");
}

// The categories a buffer may have, as a bit mask (all but allocator_slack and cuda_context).
constexpr unsigned kBufferCategories =
    ((1u << kNumMemCategories) - 1) & ~(1u << static_cast<int>(MemCategory::AllocatorSlack)) &
    ~(1u << static_cast<int>(MemCategory::CudaContext));
static_assert(kNumMemCategories <= 32);

}  // namespace

// StepProgram::loop_setup: one Buffer call per after_construction buffer, every temporary of a valid size and pool
// freed once after it was made.
void check_loop_setup(const StepProgram& p) {
  if (p.loop_setup.empty()) return;
  const auto f = [](std::size_t k) { return "program.loop_setup[" + std::to_string(k) + "]"; };
  const auto made =
      std::count_if(p.buffers.begin(), p.buffers.end(), [](const Buffer& b) { return b.after_construction; });
  std::vector<char> freed;
  std::int64_t buffers = 0;
  for (std::size_t k = 0; k < p.loop_setup.size(); ++k) {
    const LoopSetupCall& c = p.loop_setup[k];
    if (c.kind == LoopSetupCall::Buffer) {
      ++buffers;
    } else if (c.kind == LoopSetupCall::Temporary) {
      if (c.bytes < 0) throw InputError(f(k) + ".bytes", std::to_string(c.bytes), ">= 0");
      if (c.pool_stream < 0 || c.pool_stream >= static_cast<int>(p.streams.size()))
        throw InputError(f(k) + ".pool_stream", std::to_string(c.pool_stream), "a stream id");
      freed.push_back(0);
    } else if (c.kind == LoopSetupCall::Free) {
      if (c.temporary < 0 || c.temporary >= static_cast<int>(freed.size()) ||
          freed[static_cast<std::size_t>(c.temporary)])
        throw InputError(f(k) + ".temporary", std::to_string(c.temporary), "a temporary made before and not freed yet");
      freed[static_cast<std::size_t>(c.temporary)] = 1;
    } else {
      throw InputError(f(k) + ".kind", std::to_string(static_cast<int>(c.kind)), "Buffer, Temporary or Free");
    }
  }
  if (buffers != made)
    throw InputError("program.loop_setup", std::to_string(buffers) + " Buffer calls",
                     std::to_string(made) + ", one per after_construction buffer");
  if (std::find(freed.begin(), freed.end(), 0) != freed.end())
    throw InputError("program.loop_setup", "a temporary never freed", "every temporary freed");
}

void check_streams_and_buffers(const StepProgram& p) {
  const int n_streams = static_cast<int>(p.streams.size());
  const int n_buffers = static_cast<int>(p.buffers.size());
  if (n_streams == 0) throw InputError("program.streams", "[]", "at least the compute stream");
  for (std::size_t k = 0; k < p.init_originals.size(); ++k)
    for (std::size_t j = 0; j < p.init_originals[k].size(); ++j)
      if (p.init_originals[k][j] < 0)
        throw InputError("program.init_originals[" + std::to_string(k) + "][" + std::to_string(j) + "]",
                         std::to_string(p.init_originals[k][j]), ">= 0 bytes");
  if (!p.init_offloaded.empty() && p.init_flatten_world < 1)
    throw InputError("program.init_offloaded", std::to_string(p.init_offloaded.size()) + " entries",
                     "none unless FSDP1's construction is modelled (program.init_flatten_world >= 1, here " +
                         std::to_string(p.init_flatten_world) + ")");
  for (std::size_t k = 0; k < p.init_offloaded.size(); ++k) {
    const InitOffloaded& o = p.init_offloaded[k];
    const std::string f = "program.init_offloaded[" + std::to_string(k) + "]";
    if (o.bytes < 0) throw InputError(f + ".bytes", std::to_string(o.bytes), ">= 0");
    if (o.pool_stream < 0 || o.pool_stream >= n_streams)
      throw InputError(f + ".pool_stream", std::to_string(o.pool_stream),
                       "a stream id in [0, " + std::to_string(n_streams) + ")");
    if (o.originals < -1 || o.originals >= static_cast<int>(p.init_originals.size()))
      throw InputError(f + ".originals", std::to_string(o.originals),
                       "-1, or an index into program.init_originals (" + std::to_string(p.init_originals.size()) +
                           " lists)");
  }
  for (int s = 0; s < n_streams; ++s)
    if (p.streams[s].id != s)
      throw InputError("program.streams[" + std::to_string(s) + "].id", std::to_string(p.streams[s].id),
                       "the stream's index " + std::to_string(s));
  // check_buffer's conditions as one yes/no per buffer (unsigned compares for the ranges, the
  // category looked up in a mask); on a failure check_buffer throws the first error in its order.
  const Buffer* bufs = p.buffers.data();
  for (int b = 0; b < n_buffers; ++b) {
    const Buffer& buf = bufs[b];
    const unsigned c = static_cast<unsigned>(buf.category);
    if (buf.id != b || buf.bytes < 0 || static_cast<unsigned>(buf.pool_stream) >= static_cast<unsigned>(n_streams) ||
        c >= 32 || !((kBufferCategories >> c) & 1u) || (buf.first_step_lazy && !buf.persistent) ||
        (buf.after_construction && (!buf.persistent || buf.first_step_lazy)) ||
        (buf.init_originals != -1 && (static_cast<unsigned>(buf.init_originals) >= p.init_originals.size() ||
                                      !buf.persistent || buf.first_step_lazy ||
                                      buf.category != MemCategory::ShardedParams))) [[unlikely]] {
      check_buffer(p, b, n_streams);   // throws the InputError
      throw std::logic_error("check_streams_and_buffers: the fast check and check_buffer disagree on buffer " +
                             std::to_string(b));
    }
  }
}

void check_op(const StepProgram& p, int id, int n_streams, int n_buffers) {
  const Op& op = p.ops[id];
  const std::size_t i = static_cast<std::size_t>(id);
  if (op.id != id) throw InputError(op_field(i, "id"), std::to_string(op.id), "the op's index " + std::to_string(i));
  if (op.stream < 0 || op.stream >= n_streams)
    throw InputError(op_field(i, "stream"), std::to_string(op.stream),
                     "a stream id in [0, " + std::to_string(n_streams) + ")");
  int k = static_cast<int>(op.kind);
  if (k < 0 || k > static_cast<int>(OpKind::CpuOptimizerStep))
    throw InputError(op_field(i, "kind"), std::to_string(k), "an OpKind");
  // Unsigned compares: one branch per id for "0 <= w < id".
  for (int w : op.waits)
    if (static_cast<unsigned>(w) >= static_cast<unsigned>(id))
      throw InputError(op_field(i, "waits"), std::to_string(w), "ids of earlier ops (in [0, " + std::to_string(id) + "))");
  for (int w : op.cpu_waits)
    if (static_cast<unsigned>(w) >= static_cast<unsigned>(id))
      throw InputError(op_field(i, "cpu_waits"), std::to_string(w),
                       "ids of earlier ops (in [0, " + std::to_string(id) + "))");
  for (int b : op.allocs) {
    if (static_cast<unsigned>(b) >= static_cast<unsigned>(n_buffers))
      throw InputError(op_field(i, "allocs"), std::to_string(b), "buffer ids in [0, " + std::to_string(n_buffers) + ")");
    if (p.buffers[b].persistent && !p.buffers[b].first_step_lazy)
      throw InputError(op_field(i, "allocs"), std::to_string(b),
                       "non-persistent or first_step_lazy buffers (persistent ones are allocated before the step)");
  }
  int prev_reuse = free_inside_op(1);
  for (const FreeSpec& f : op.frees) {
    if (static_cast<unsigned>(f.buffer) >= static_cast<unsigned>(n_buffers))
      throw InputError(op_field(i, "frees.buffer"), std::to_string(f.buffer),
                       "buffer ids in [0, " + std::to_string(n_buffers) + ")");
    if (!valid_free_reuse(f.reuse_after_op, prev_reuse, id, static_cast<int>(op.allocs.size())))
      throw InputError(op_field(i, "frees.reuse_after_op"), std::to_string(f.reuse_after_op),
                       "-1, the id of an op issued so far (<= " + std::to_string(id) + "), or a free inside the op "
                       "(<= -2: after its first -2 - value allocs, between 1 and " + std::to_string(op.allocs.size()) +
                       ", listed before the other frees, in order)");
    prev_reuse = f.reuse_after_op;
  }
  if (is_collective(op.kind)) {
    int g = static_cast<int>(op.group);
    if (g < 0 || g > static_cast<int>(CommGroup::PostForward))
      throw InputError(op_field(i, "group"), std::to_string(g), "a CommGroup");
    if (op.group_size < 1) throw InputError(op_field(i, "group_size"), std::to_string(op.group_size), ">= 1");
    if (op.comm_bytes < 0) throw InputError(op_field(i, "comm_bytes"), std::to_string(op.comm_bytes), ">= 0");
  }
  if (op.copy_bytes < 0) throw InputError(op_field(i, "copy_bytes"), std::to_string(op.copy_bytes), ">= 0");
  if (op.cpu_hooks < 0) throw InputError(op_field(i, "cpu_hooks"), std::to_string(op.cpu_hooks), ">= 0");
  if (op.kernel_launches < 0)
    throw InputError(op_field(i, "kernel_launches"), std::to_string(op.kernel_launches), ">= 0");
}

}  // namespace detail

void validate_program(const StepProgram& p) {
  detail::check_streams_and_buffers(p);
  detail::check_loop_setup(p);
  const int n_streams = static_cast<int>(p.streams.size());
  const int n_buffers = static_cast<int>(p.buffers.size());
  const int n = static_cast<int>(p.ops.size());
  for (int i = 0; i < n; ++i) detail::check_op(p, i, n_streams, n_buffers);
}

}  // namespace fsdpsim::sim
