// safetensors files (the format of huggingface/safetensors): 8-byte little-endian header length N,
// N bytes of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the raw little-endian tensor bytes, offsets relative to the
// end of the header. Our writer stores tensors in name order, packed with no gaps, and pads the header
// with spaces to a multiple of 8 bytes; the reader accepts any valid file.
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
  TensorMap tensors;                           // contiguous CPU tensors
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
// and a data section longer or shorter (truncated file) than the tensors.
SafetensorsFile load_safetensors(const std::string& path);
// Same, from bytes in memory; `source` names them in errors.
SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& source);

// A destination tensor of load_into: `target` is overwritten in place (no autograd) with the tensor
// of the same name, converted to target's dtype and device.
struct NamedTarget {
  std::string name;
  torch::Tensor target;
};

// Copies loaded[name] into every target. Before copying anything, checks that the names match
// exactly and the shapes agree; otherwise throws one cemfrac::Error line naming `source` and listing
// the missing tensors, the extra tensors and the shape mismatches ("w: file [4, 8] vs model [4, 6]").
void load_into(const TensorMap& loaded, const std::vector<NamedTarget>& targets,
               const std::string& source);

}  // namespace cemfrac
