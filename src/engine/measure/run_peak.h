// The peak a run's MFU divides by: the device's measured matrix-product rate, measured once per
// run and recorded in the run dir, so that a resumed run's MFU is against the same figure.
#pragma once

#include <torch/types.h>

#include <string>

namespace trainer::engine {

// A run's peak TFLOP/s and the log line that says where it comes from.
struct RunPeak {
  double tflops = 0;
  bool reused = false;  // read from the run's record, not measured by this process
  std::string note;     // for the log: measured and recorded, reused, or re-measured and why
};

// The kind of device whose rate a peak is: the GPU's product name ("cuda: NVIDIA H100 80GB
// HBM3"), or the CPU's model name and LibTorch's intra-op threads ("cpu: Intel(R) Xeon(R) ...,
// 2 threads").
std::string device_kind(torch::Device device);

// The name of a compute dtype in the record and the log: "float32", "bfloat16", "float16".
std::string dtype_name(c10::ScalarType dtype);

// The file a run records its peak in: <run_dir>/peak_tflops.json, {"device", "dtype", "tflops"}.
std::string peak_record_path(const std::string& run_dir);

// The run's peak for `device` and `dtype`. A resumed run (`resuming`) reuses the record of the
// run dir when it names this device kind and dtype; otherwise (a fresh run, no readable record,
// another device kind or dtype) the rate is measured as matmul_peak_tflops measures it, and with
// `record` (rank 0) written to the record, atomically. The note says which, and for a resume that
// re-measured, why and what the record held.
RunPeak run_peak_tflops(const std::string& run_dir, torch::Device device, c10::ScalarType dtype,
                        bool resuming, bool record);

}  // namespace trainer::engine
