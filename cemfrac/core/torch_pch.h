// Precompiled header for every target that links cemfrac_lib. Only the heavy, stable torch headers
// that most files need go here: tensors and ops, torch::nn::Module, autograd, NoGradGuard /
// manual_seed. Not <torch/torch.h>: that also parses every nn module, functional, optimizer, data
// and serialize header, which makes the PCH larger and slower to load in every translation unit.
// Our own files still include exactly what they use (torch::optim and nn modules only where used),
// so the build also works without the PCH (-DCEMFRAC_USE_PCH=OFF).
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/utils.h>
