// The device a command runs on: the global --device flag, else the run config's train.device, else
// the CPU (cemfrac/core/device.h parses and checks it).
#pragma once
#include <c10/core/Device.h>

#include <string>

#include "cemfrac/core/device.h"
#include "cli/commands.h"

namespace cemfrac::cli {

// `config_device` is the run config's train.device ("" for commands without a run config).
inline c10::Device command_device(const GlobalOptions& global,
                                  const std::string& config_device = "") {
  if (!global.device.empty()) return parse_device(global.device, "--device");
  if (!config_device.empty()) return parse_device(config_device, "train.device");
  return c10::Device(c10::kCPU);
}

// The same from the flag's text ("" = not given).
inline c10::Device command_device(const std::string& flag, const std::string& config_device) {
  GlobalOptions global;
  global.device = flag;
  return command_device(global, config_device);
}

}  // namespace cemfrac::cli
