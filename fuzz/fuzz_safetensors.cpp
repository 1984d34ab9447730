// safetensors (cemfrac/io/safetensors.h): the input is a whole file. decode_safetensors parses the
// header and the tensor table; what it accepts must survive encode -> decode unchanged, and
// load_safetensors (the path the checkpoint loader takes) must give the same answer from a file.
#include <cstring>

#include "cemfrac/io/safetensors.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace cemfrac;

bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const size_t n = static_cast<size_t>(a.numel()) * a.element_size();
  return n == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), n) == 0;
}

bool same_file(const SafetensorsFile& a, const SafetensorsFile& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (auto ia = a.tensors.begin(), ib = b.tensors.begin(); ia != a.tensors.end(); ++ia, ++ib) {
    if (ia->first != ib->first || !same_bytes(ia->second, ib->second)) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(fuzz::as_text(data, size));
  bool decoded = false;
  SafetensorsFile file;
  fuzz::expect_clean([&] {
    file = decode_safetensors(bytes, "fuzz.safetensors");
    decoded = true;
  });
  const std::string path = fuzz::scratch_dir() + "/model.safetensors";
  fuzz::write_bytes(path, bytes);
  bool loaded = false;
  SafetensorsFile from_disk;
  fuzz::expect_clean([&] {
    from_disk = load_safetensors(path);
    loaded = true;
  });
  FUZZ_REQUIRE(decoded == loaded);
  if (!decoded) return 0;
  FUZZ_REQUIRE(same_file(file, from_disk));
  for (const auto& [name, tensor] : file.tensors) {
    FUZZ_REQUIRE(tensor.defined() && tensor.is_contiguous());
  }
  const SafetensorsFile again =
      decode_safetensors(encode_safetensors(file.tensors, file.metadata), "re-encoded");
  FUZZ_REQUIRE(same_file(file, again));
  return 0;
}
