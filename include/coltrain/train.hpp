#pragma once
// coltrain's training loop and what surrounds it: data-parallel gradient synchronisation, ZeRO-1,
// the trainer, metrics, the phase profile, run records and checkpoints.

#include <coltrain/train/checkpoint.hpp>
#include <coltrain/train/data_parallel.hpp>
#include <coltrain/train/early_stopping.hpp>
#include <coltrain/train/elastic.hpp>
#include <coltrain/train/metrics.hpp>
#include <coltrain/train/phase_tracker.hpp>
#include <coltrain/train/run_log.hpp>
#include <coltrain/train/state_dict.hpp>
#include <coltrain/train/trainer.hpp>
#include <coltrain/train/zero_optimizer.hpp>
