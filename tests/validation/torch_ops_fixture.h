// Reading a PyTorch per-op timing fixture (tests/fixtures/torch_ops/<case>.ops.json, written by
// scripts/torch_memory/op_profile.py on a lent GPU: CUDA kernel time per training step under
// torch.profiler, FSDP2 on the fake process group) and comparing it class by class with the kernels
// and times the simulator's cost model gives the same plan (issue 20, "per-op timing reference").
#pragma once
#include <map>
#include <string>
#include <vector>

#include "calibrate/hardware_profile.h"
#include "models/model_spec.h"
#include "program/plan.h"

namespace fsdpsim::validation {

// The op classes both sides are summed into. The fake process group's own collective copies are left
// out (NCCL would communicate there; the simulator times collectives separately).
// "host_copy": copies between the GPU and pinned host memory (torchtune's activation offloading; PyTorch's profiler
// names them "Memcpy DtoH (Device -> Pinned)" / "Memcpy HtoD (Pinned -> Device)"), the simulator's D2H / H2D ops.
inline const std::vector<std::string> kOpClasses = {"gemm", "attention", "other_compute", "fsdp_copy", "optimizer",
                                                    "host_copy"};

struct ClassFigure {
  double us_per_step = 0;
  double kernels_per_step = 0;
};

struct TorchOpsFixture {
  std::string file;
  std::string name;
  std::string gpu;                        // context.gpu.name
  std::string torch_version;
  models::ModelSpec model;
  calibrate::Cluster cluster;
  sim::Plan plan;                         // resolved for the cluster
  std::map<std::string, ClassFigure> measured;   // by kOpClasses
  double fake_collective_us = 0;          // left out of every comparison
  double step_wall_unprofiled_s = 0;      // the mean of the unprofiled steps
};

// Which class a measured kernel belongs to ("" for the fake group's collective copies).
std::string measured_class(const std::string& harness_class, const std::string& kernel_name);

// Reads one fixture; InputError names the file and the field.
TorchOpsFixture read_torch_ops_fixture(const std::string& path);

// The simulator's figures per class for one optimizer step of the fixture's plan: the kernels of every
// forward, backward and recompute op of the lowered program, FSDP's copy-in/out, casts and divides, and
// the GPU optimizer step, each timed by the hardware profile (collectives left out).
std::map<std::string, ClassFigure> simulated_classes(const TorchOpsFixture& f, const calibrate::HardwareProfile& hw);

}  // namespace fsdpsim::validation
