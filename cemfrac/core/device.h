// The device a command computes on, as data (DESIGN.md, third wave: "Device is data"): one parse of
// the user's text ("cpu", "cuda", "cuda:N", "meta"), checked against this build and machine, and
// the one message every command gives when the meta device's dry run reaches a value it must read.
#pragma once
#include <c10/core/Device.h>

#include <string>

namespace cemfrac {

// "cpu" (the default), "cuda" (= cuda:0), "cuda:N", or "meta" (tensors with shapes and no data: a
// dry run of shapes). Anything else, or cuda on a build or machine without it (or N beyond the
// visible GPUs), is a one-line cemfrac::Error naming `source` (e.g. "--device") and the choices.
c10::Device parse_device(const std::string& text, const std::string& source);

// True when `text` is one of the names parse_device reads (whether or not this machine has it):
// config validation, which may run on another machine than the run.
bool is_device_name(const std::string& text);

// True when a LibTorch error says a value was read from a meta tensor (.item(), a copy to the
// host): where a dry run on the meta device ends.
bool is_meta_read_error(const std::string& what);

// The one line a command prints when its dry run on the meta device stopped there.
std::string meta_dry_run_message(const std::string& what);

}  // namespace cemfrac
