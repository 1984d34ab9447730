// Precompiled header for every target that links cemfrac_lib. Only the heavy, stable torch headers go
// here; our own headers still include exactly what they use, so the build also works without the PCH
// (-DCEMFRAC_USE_PCH=OFF).
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>
