// safetensors files (the format of huggingface/safetensors): 8-byte little-endian header length N,
// N bytes of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the raw little-endian tensor bytes, offsets relative to
// the end of the header. Our writer stores tensors in name order, packed with no gaps, and pads the
// header with spaces to a multiple of 8 bytes; the reader accepts any valid file.
//
// Tied tensors are stored once because the caller passes one name per distinct tensor (the model's
// parameter table). No mmap: a file is read tensor by tensor straight into fresh CPU tensors.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cemfrac {

// name -> tensor. Sorted by name, which is the order our writer stores them in.
using TensorMap = std::map<std::string, torch::Tensor>;

struct SafetensorsFile {
  TensorMap tensors;                            // contiguous CPU tensors
  std::map<std::string, std::string> metadata;  // "__metadata__" (string values only)
};

// Supported dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL.
const char* safetensors_dtype_name(torch::ScalarType dtype);  // throws for unsupported dtypes

// The complete file contents for `tensors` (any device, any strides) and `metadata`.
std::string encode_safetensors(const TensorMap& tensors,
                               const std::map<std::string, std::string>& metadata = {});
// Writes encode_safetensors() to `path` atomically (core/atomic_file.h).
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads and validates a whole file. Every defect is a cemfrac::Error whose one line names `path`:
// a file shorter than 8 bytes, a header length beyond the file, a header that is not a JSON object,
// an entry without dtype/shape/data_offsets, an unknown dtype, negative dims, offsets out of range,
// overlapping or leaving gaps in the data section, a byte range that disagrees with shape x dtype,
// a data section longer or shorter (truncated file) than the tensors, and a key that appears twice
// in any object of the header (JSON parsers disagree on which copy wins).
SafetensorsFile load_safetensors(const std::string& path);
// Same, from bytes in memory; `source` names them in errors.
SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& source);

// Refuses a floating-point tensor of `file` holding NaN (always) or +-Inf (unless allow_inf: the
// ladders' recorded-range buffers start at +-Inf): one cemfrac::Error line naming `source`, the
// tensor, how many values are bad and the first one's flat index. Integer tensors pass.
void check_finite(const TensorMap& tensors, const std::string& source, bool allow_inf = false);

// A destination tensor of load_into: `target` is overwritten in place (no autograd) with the tensor
// of the same name, moved to target's device. The dtypes must be equal: nothing is converted.
struct NamedTarget {
  std::string name;
  torch::Tensor target;
};

// Copies loaded[name] into every target. Before copying anything, checks that the names match
// exactly and the shapes agree; otherwise throws one cemfrac::Error line naming `source` and
// listing the missing tensors, the extra tensors and the shape mismatches ("w: file [4, 8] vs model
// [4, 6]"). Then refuses a tensor whose dtype is not the target's (cemfrac's weights are F32: an
// I32 or F16 tensor is an error naming it, never converted).
void load_into(const TensorMap& loaded, const std::vector<NamedTarget>& targets,
               const std::string& source);

}  // namespace cemfrac
