// The metadata of a Chrome trace as Kineto writes it: the keys after `traceEvents` (`traceName`,
// the errors Kineto logged while recording under `ERROR`, ...). Plain text: no torch.
#pragma once

#include <string>

namespace trainer::engine {

// Rewrites the metadata after the `traceEvents` array of the Chrome trace `text` (as Kineto's
// ChromeTraceLogger writes it): `traceName` becomes `trace_name` (Kineto names the file it wrote,
// a temporary one), and the GPU probe's "gpuGetDeviceCount failed" error of a machine without a
// GPU leaves the `ERROR` list (the key goes when nothing else is in it). The events are left
// byte for byte. Text without a `traceEvents` array, or whose metadata is not JSON, is returned
// as it is.
std::string fix_trace_metadata(const std::string& text, const std::string& trace_name);

}  // namespace trainer::engine
