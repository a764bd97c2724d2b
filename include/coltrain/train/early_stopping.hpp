#pragma once
// EarlyStopping: stops training when the validation loss has not improved for `patience`
// evaluations in a row (PyTorch Lightning's EarlyStopping on "val_loss", mode "min", min_delta 0).
// The loss is the whole validation set's (summed across ranks), so every rank takes the same
// decision without a collective. Its state travels in checkpoints (to_json / from_json), so a
// resumed run stops where an uninterrupted one would.

#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <optional>
#include <sstream>
#include <string>

namespace coltrain::train {

class EarlyStopping {
 public:
  // patience >= 1: the number of evaluations without improvement that stops the run.
  explicit EarlyStopping(std::int64_t patience) : patience_(patience) {
    if (patience < 1)
      throw InvalidArgument("EarlyStopping: patience must be >= 1 (got " +
                            std::to_string(patience) + ")");
  }

  // Records the validation loss of `epoch` (1-based); returns whether training should stop. A NaN
  // loss never counts as an improvement.
  bool update(double validation_loss, std::int64_t epoch) {
    if (!best_loss_ || validation_loss < *best_loss_) {
      best_loss_ = validation_loss;
      best_epoch_ = epoch;
      without_improvement_ = 0;
    } else {
      ++without_improvement_;
    }
    return should_stop();
  }

  bool should_stop() const { return without_improvement_ >= patience_; }

  // "validation loss has not improved on 0.0412 (epoch 7) for 3 epochs"
  std::string reason() const {
    std::ostringstream text;
    text << "validation loss has not improved on " << std::fixed << std::setprecision(4)
         << best_loss_.value_or(NAN) << " (epoch " << best_epoch_ << ") for "
         << without_improvement_ << (without_improvement_ == 1 ? " epoch" : " epochs");
    return text.str();
  }

  std::optional<double> best_loss() const { return best_loss_; }
  std::int64_t best_epoch() const { return best_epoch_; }
  std::int64_t epochs_without_improvement() const { return without_improvement_; }

  Json to_json() const {
    Json state;
    state["best_validation_loss"] = best_loss_;
    state["best_epoch"] = best_epoch_;
    state["epochs_without_improvement"] = without_improvement_;
    return state;
  }

  // Takes the state to_json() wrote; a checkpoint written without early stopping has none, and
  // the count starts afresh.
  void from_json(const Json& state) {
    if (!state.is_object()) return;
    const Json best = state.value("best_validation_loss", Json());
    best_loss_ = best.is_number() ? std::optional<double>(best.get<double>()) : std::nullopt;
    best_epoch_ = state.value("best_epoch", 0).get<std::int64_t>();
    without_improvement_ = state.value("epochs_without_improvement", 0).get<std::int64_t>();
  }

 private:
  std::int64_t patience_;
  std::optional<double> best_loss_;
  std::int64_t best_epoch_ = 0;
  std::int64_t without_improvement_ = 0;
};

}  // namespace coltrain::train
