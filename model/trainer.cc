// Training and evaluation loops.
#include "model/trainer.h"

#include <utility>

#include "core/clock.h"
#include "core/status.h"

namespace dlrm::model {

absl::Status EvalOptions::Validate() const {
  if (batch_size <= 0) {
    return absl::InvalidArgumentError("eval batch_size must be > 0");
  }
  if (max_samples < 0) {
    return absl::InvalidArgumentError("eval max_samples must be >= 0");
  }
  return absl::OkStatus();
}

absl::Status TrainOptions::Validate() const {
  if (batch_size <= 0)
    return absl::InvalidArgumentError("batch_size must be > 0");
  if (epochs <= 0) return absl::InvalidArgumentError("epochs must be > 0");
  if (max_steps < 0 || eval_interval < 0 || log_interval < 0) {
    return absl::InvalidArgumentError(
        "max_steps, eval_interval and log_interval must be >= 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> Evaluate(const PredictFn& predict,
                                    data::BatchSource& source,
                                    const EvalOptions& options,
                                    const ReferenceScorer& reference,
                                    const std::atomic<bool>* cancel) {
  RETURN_IF_ERROR(options.Validate());
  RETURN_IF_ERROR(source.Rewind());
  MetricsAccumulator acc, ref_acc;
  data::Batch batch;
  std::vector<float> probs, ref_probs;
  int64_t seen = 0;
  while (options.max_samples == 0 || seen < options.max_samples) {
    if (cancel != nullptr && cancel->load()) {
      return absl::CancelledError("evaluation cancelled");
    }
    int64_t want = options.batch_size;
    if (options.max_samples > 0) {
      want = std::min(want, options.max_samples - seen);
    }
    ASSIGN_OR_RETURN(bool more, source.Next(want, &batch));
    if (!more || batch.size == 0) break;
    RETURN_IF_ERROR(predict(batch, &probs));
    acc.Add(probs, batch.labels);
    if (reference) {
      ref_probs.resize(batch.size);
      reference(batch, ref_probs.data());
      ref_acc.Add(ref_probs, batch.labels);
    }
    seen += batch.size;
  }
  if (seen == 0) {
    return absl::FailedPreconditionError("evaluation data is empty");
  }
  EvalResult result;
  result.model = acc.Compute();
  if (reference) {
    result.reference = ref_acc.Compute();
    result.has_reference = true;
  }
  return result;
}

absl::StatusOr<EvalResult> Evaluate(Model& model, data::BatchSource& source,
                                    const EvalOptions& options,
                                    const ReferenceScorer& reference) {
  return Evaluate(
      [&model](const data::Batch& batch, std::vector<float>* probs) {
        return model.Predict(batch, probs);
      },
      source, options, reference);
}

absl::StatusOr<TrainResult> Train(Model& model, data::BatchSource& train,
                                  data::BatchSource* eval,
                                  const TrainOptions& options,
                                  const EvalOptions& eval_options,
                                  const TrainCallbacks& callbacks,
                                  const ReferenceScorer& reference) {
  RETURN_IF_ERROR(options.Validate());
  RETURN_IF_ERROR(eval_options.Validate());
  TrainResult result;
  TrainProgress window;
  double window_loss = 0;
  int64_t window_steps = 0, window_samples = 0;
  double window_model_seconds = 0;
  const double start = MonotonicSeconds();
  data::Batch batch;

  auto report = [&](int epoch) {
    if (window_steps == 0) return;
    window.step = result.steps;
    window.samples = result.samples;
    window.epoch = epoch;
    window.loss = window_loss / window_steps;
    window.samples_per_second =
        window_model_seconds > 0 ? window_samples / window_model_seconds : 0;
    window.elapsed_seconds = MonotonicSeconds() - start;
    result.final_loss = window.loss;
    if (callbacks.on_progress) callbacks.on_progress(window);
    window = TrainProgress();
    window_loss = 0;
    window_steps = window_samples = 0;
    window_model_seconds = 0;
  };
  auto evaluate = [&]() -> absl::Status {
    if (eval == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(EvalResult r,
                     Evaluate(model, *eval, eval_options, reference));
    if (callbacks.on_eval) callbacks.on_eval(result.steps, r);
    return absl::OkStatus();
  };

  bool done = false;
  int epoch = 0;
  // The batch after the current one is read before the step, so cached
  // tables load its rows while the step computes (Model::TrainStep).
  data::Batch next;
  for (; epoch < options.epochs && !done; ++epoch) {
    if (epoch > 0) RETURN_IF_ERROR(train.Rewind());
    ASSIGN_OR_RETURN(bool more, train.Next(options.batch_size, &batch));
    more = more && batch.size > 0;
    while (more) {
      if (options.max_steps > 0 && result.steps >= options.max_steps) {
        done = true;
        break;
      }
      // No read past the last step max_steps allows.
      bool has_next = false;
      if (options.max_steps == 0 || result.steps + 1 < options.max_steps) {
        ASSIGN_OR_RETURN(has_next, train.Next(options.batch_size, &next));
        has_next = has_next && next.size > 0;
      }
      const double t0 = MonotonicSeconds();
      ASSIGN_OR_RETURN(StepResult step,
                       model.TrainStep(batch, has_next ? &next : nullptr));
      const double dt = MonotonicSeconds() - t0;
      ++result.steps;
      result.samples += step.samples;
      result.model_seconds += dt;
      for (int s = 0; s < StageTimes::kNumStages; ++s) {
        result.stage_seconds.seconds[s] += step.times.seconds[s];
        window.stage_seconds.seconds[s] += step.times.seconds[s];
      }
      window_loss += step.loss;
      ++window_steps;
      window_samples += step.samples;
      window_model_seconds += dt;
      if (options.log_interval > 0 &&
          result.steps % options.log_interval == 0) {
        report(epoch);
      }
      if (options.eval_interval > 0 &&
          result.steps % options.eval_interval == 0) {
        RETURN_IF_ERROR(evaluate());
      }
      std::swap(batch, next);
      more = has_next;
    }
    if (options.max_steps > 0 && result.steps >= options.max_steps) {
      done = true;
    }
  }
  report(epoch > 0 ? epoch - 1 : 0);
  result.seconds = MonotonicSeconds() - start;
  if (options.eval_interval == 0 || result.steps % options.eval_interval != 0) {
    RETURN_IF_ERROR(evaluate());
  }
  return result;
}

}  // namespace dlrm::model
