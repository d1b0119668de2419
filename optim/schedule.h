// Learning-rate schedules: the multiplier of an optimizer's learning rate
// at each update (OptimizerConfig.schedule), written once for the host and
// CUDA devices. Every rule's MakeStep (rules.h) puts learning_rate x
// LearningRateMultiplier(schedule, t) in its step constants, so the dense
// optimizer, the embedding tables (host and RocksDB) and the CUDA kernels
// all follow the schedule by reading Step::learning_rate.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace dlrm::optim {

// OptimizerConfig.schedule as plain numbers (proto/dlrm/config.proto has
// each field's meaning); the defaults are a constant rate.
struct Schedule {
  enum class Decay {
    kNone,        // decay(t) = 1.
    kPolynomial,  // PolynomialDecay.
    kStep,        // StepDecay.
  };
  // Linear warm-up over updates 1..warmup_steps, from warmup_start_factor
  // (at t = 0) to 1. Default: none.
  int64_t warmup_steps = 0;
  double warmup_start_factor = 0;
  Decay decay = Decay::kNone;
  // Both decays: the last update at the full rate. Default: 0.
  int64_t decay_start_step = 0;
  // kPolynomial: updates it takes, exponent and final multiplier.
  int64_t decay_steps = 1;
  double power = 2;
  double end_factor = 0;
  // kStep: updates between decays and the factor of each.
  int64_t step_size = 1;
  double gamma = 0.1;
};

namespace internal {

DLRM_HOST_DEVICE inline double Pow(double x, double y) {
#if defined(__CUDA_ARCH__)
  return ::pow(x, y);
#else
  return std::pow(x, y);
#endif
}

}  // namespace internal

// The multiplier of the learning rate at update `step` (1 for the first;
// 0, before any update, gives the warm-up's start): warmup(step) x
// decay(step), in double so that learning_rate x multiplier is rounded to
// float once. Exactly 1 for a constant schedule. `schedule` must be valid
// (optim::Validate).
DLRM_HOST_DEVICE inline double LearningRateMultiplier(const Schedule& schedule,
                                                      int64_t step) {
  double warmup = 1.0;
  if (step < schedule.warmup_steps) {
    const double start = schedule.warmup_start_factor;
    warmup = start + (1.0 - start) * static_cast<double>(step) /
                         static_cast<double>(schedule.warmup_steps);
  }
  int64_t decayed = step - schedule.decay_start_step;
  if (decayed < 0) decayed = 0;
  double decay = 1.0;
  switch (schedule.decay) {
    case Schedule::Decay::kNone:
      break;
    case Schedule::Decay::kPolynomial: {
      if (decayed > schedule.decay_steps) decayed = schedule.decay_steps;
      const double left = 1.0 - static_cast<double>(decayed) /
                                    static_cast<double>(schedule.decay_steps);
      decay = schedule.end_factor +
              (1.0 - schedule.end_factor) * internal::Pow(left, schedule.power);
      break;
    }
    case Schedule::Decay::kStep:
      decay = internal::Pow(schedule.gamma,
                            static_cast<double>(decayed / schedule.step_size));
      break;
  }
  return warmup * decay;
}

// The Schedule of an OptimizerConfig (normalised: a power or gamma of 0 is
// its default already). A template over the config type, as MakeStep, so
// that CUDA files including this header need no Protobuf headers.
template <typename Config>
Schedule ScheduleOf(const Config& config) {
  Schedule s;
  const auto& c = config.schedule();
  s.warmup_steps = c.warmup_steps();
  s.warmup_start_factor = c.warmup_start_factor();
  if (c.has_polynomial_decay()) {
    const auto& p = c.polynomial_decay();
    s.decay = Schedule::Decay::kPolynomial;
    s.decay_start_step = p.decay_start_step();
    s.decay_steps = p.decay_steps();
    s.power = p.power();
    s.end_factor = p.end_factor();
  } else if (c.has_step_decay()) {
    const auto& p = c.step_decay();
    s.decay = Schedule::Decay::kStep;
    s.decay_start_step = p.decay_start_step();
    s.step_size = p.step_size();
    s.gamma = p.gamma();
  }
  return s;
}

// learning_rate x LearningRateMultiplier at update `step`, rounded once to
// float: the rate every rule's Step carries. For a constant schedule it is
// config.learning_rate() itself, bit for bit.
template <typename Config>
float ScheduledLearningRate(const Config& config, int64_t step) {
  return static_cast<float>(static_cast<double>(config.learning_rate()) *
                            LearningRateMultiplier(ScheduleOf(config), step));
}

}  // namespace dlrm::optim
