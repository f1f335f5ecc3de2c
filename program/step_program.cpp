#include "program/step_program.h"

namespace fsdpsim::sim {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Forward: return "forward";
    case OpKind::Backward: return "backward";
    case OpKind::Recompute: return "recompute";
    case OpKind::AllGather: return "all_gather";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::CopyIn: return "copy_in";
    case OpKind::CopyOut: return "copy_out";
    case OpKind::Cast: return "cast";
    case OpKind::Pad: return "pad";
    case OpKind::Divide: return "divide";
    case OpKind::H2D: return "h2d";
    case OpKind::D2H: return "d2h";
    case OpKind::OptimizerStep: return "optimizer_step";
    case OpKind::CpuOptimizerStep: return "cpu_optimizer_step";
  }
  return "unknown";
}

}  // namespace fsdpsim::sim
