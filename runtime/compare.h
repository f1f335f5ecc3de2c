// Validation: a predicted step (the simulator) against a measured one (the runtime), both from the
// same StepProgram, compared op by op. Every error is relative and signed:
//   error = (predicted - measured) / measured     (> 0: the prediction is too high)
// and null in JSON when the measured value is 0.
#pragma once
#include <optional>

#include <nlohmann/json.hpp>

#include "program/sim_result.h"

namespace fsdpsim::runtime {

std::optional<double> relative_error(double predicted, double measured);

// The comparison document:
//   peak_allocated_error, peak_reserved_error, step_time_error      (the headline numbers)
//   predicted / measured: the compared quantities side by side (bytes, seconds)
//   attribution: where the step-time difference comes from (compute busy, collective busy,
//     exposed communication, CPU blocked), each as predicted - measured seconds
//   per_stream: busy time of each track (compute, all_gather, ...) predicted vs measured
//   per_kind:   total duration of each op kind (forward, all_gather, ...) predicted vs measured
//   per_op:     every op, matched by (name, kind, unit, occurrence): durations and start times
//   memory_breakdown: each category at the allocated peak, predicted vs measured
// Spans present in one trace only are listed under unmatched_ops.
nlohmann::json compare_results(const sim::SimResult& predicted, const sim::SimResult& measured);

}  // namespace fsdpsim::runtime
