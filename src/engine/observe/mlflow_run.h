// tracking.mlflow for a training run: the MLflow client (tracking/mlflow.h) started with the
// resolved config as the run's parameters, its system tags and config.yaml as an artifact. The
// MLflow run's id is kept in <run.dir>/mlflow_run_id, so that a resumed training continues the
// same MLflow run.
#pragma once

#include <memory>

#include "config/config.h"
#include "config/loader.h"
#include "tracking/mlflow.h"

namespace trainer::engine {

// With tracking.mlflow.uri set: throws ConfigError (at the key) when MLflow's environment
// variables for the server's credentials and TLS cannot be used (tracking/mlflow_auth.h), so that
// the run stops before it starts.
void check_mlflow_setup(const config::LoadedConfig& loaded);

// The client for rank 0 of a run with tracking.mlflow.uri set; nullptr without it. `resumed`:
// the run continues from a checkpoint (the MLflow run it started, when the run dir names one).
// Returns at once: nothing waits for the server.
std::unique_ptr<tracking::MlflowTracker> start_mlflow(const config::Config& cfg, bool resumed);

}  // namespace trainer::engine
