// tracking.mlflow for a training run: the MLflow client (tracking/mlflow.h) started with the
// resolved config as the run's parameters, its system tags and config.yaml as an artifact. The
// MLflow run's id is kept in <run.dir>/mlflow_run_id, so that a resumed training continues the
// same MLflow run.
#pragma once

#include <memory>

#include "config/config.h"
#include "tracking/mlflow.h"

namespace trainer::engine {

// The client for rank 0 of a run with tracking.mlflow.uri set; nullptr without it. `resumed`:
// the run continues from a checkpoint (the MLflow run it started, when the run dir names one).
// Returns at once: nothing waits for the server.
std::unique_ptr<tracking::MlflowTracker> start_mlflow(const config::Config& cfg, bool resumed);

}  // namespace trainer::engine
