// Shape-only (Meta) kernels for the few ATen ops our models use that LibTorch 1.13 gives a meta
// kernel only from Python (torch/_meta_registrations.py, registered when `import torch` runs), so
// that the C++ engine runs a model's forward and backward on the meta device (DESIGN.md, "Device is
// data"). Each is registered only where the op has no Meta kernel yet: never over Python's, nor
// over a newer LibTorch's own.
#pragma once

namespace cemfrac {

// Registers the missing kernels once (thread-safe; cheap after the first call). Called wherever a
// meta tensor is first made for a model: parse_device("meta") and the layers' init on kMeta.
void ensure_meta_kernels();

}  // namespace cemfrac
