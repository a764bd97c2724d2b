// EarlyStopping: the count of evaluations without a lower validation loss, the stop at `patience`,
// the reason it gives, and its state through a checkpoint's JSON.
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/train/early_stopping.hpp>

#include <catch2/catch.hpp>

#include <cmath>

using coltrain::train::EarlyStopping;

TEST_CASE("early stopping counts the epochs since the best validation loss", "[early_stopping]") {
  EarlyStopping stopping(2);
  CHECK_FALSE(stopping.update(0.9, 1));
  CHECK_FALSE(stopping.update(0.5, 2));
  CHECK_FALSE(stopping.update(0.5, 3));  // equal is no improvement
  CHECK(stopping.epochs_without_improvement() == 1);
  CHECK_FALSE(stopping.update(0.4, 4));  // a new best resets the count
  CHECK(stopping.epochs_without_improvement() == 0);
  CHECK_FALSE(stopping.update(0.6, 5));
  CHECK(stopping.update(std::nan(""), 6));  // NaN never improves
  CHECK(stopping.best_epoch() == 4);
  CHECK(*stopping.best_loss() == 0.4);
  CHECK(stopping.reason() == "validation loss has not improved on 0.4000 (epoch 4) for 2 epochs");
}

TEST_CASE("early stopping's state survives a checkpoint", "[early_stopping]") {
  EarlyStopping before(3);
  before.update(0.7, 1);
  before.update(0.8, 2);
  EarlyStopping after(3);
  after.from_json(before.to_json());
  CHECK(after.best_loss() == before.best_loss());
  CHECK(after.best_epoch() == 1);
  CHECK(after.epochs_without_improvement() == 1);
  CHECK_FALSE(after.update(0.75, 3));
  CHECK(after.update(0.9, 4));

  SECTION("a checkpoint without it starts the count afresh") {
    EarlyStopping fresh(1);
    fresh.from_json(coltrain::Json());
    CHECK_FALSE(fresh.best_loss().has_value());
    CHECK_FALSE(fresh.update(5.0, 1));
  }
}

TEST_CASE("early stopping needs a patience of at least 1", "[early_stopping]") {
  CHECK_THROWS_AS(EarlyStopping(0), coltrain::InvalidArgument);
}
