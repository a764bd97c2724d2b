#pragma once
// coltrain's optimizers: SGD, Adam(W), learning-rate schedules, dynamic loss scaling and the
// precision policies (fp32, fp16 and bf16 with fp32 master weights) that drive them.

#include <coltrain/core/config.hpp>
#include <coltrain/optim/adam.hpp>
#include <coltrain/optim/gradient_clipping.hpp>
#include <coltrain/optim/loss_scaler.hpp>
#include <coltrain/optim/lr_schedule.hpp>
#include <coltrain/optim/network_parameters.hpp>
#include <coltrain/optim/parameter_ref.hpp>
#include <coltrain/optim/precision.hpp>
#include <coltrain/optim/sgd.hpp>
