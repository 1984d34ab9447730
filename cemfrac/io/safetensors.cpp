#include "cemfrac/io/safetensors.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <nlohmann/json.hpp>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; a big-endian host needs byte swapping here");

namespace cemfrac {
namespace {

using json = nlohmann::json;

struct DtypeName {
  torch::ScalarType dtype;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {torch::kFloat64, "F64"},   {torch::kFloat32, "F32"}, {torch::kFloat16, "F16"},
    {torch::kBFloat16, "BF16"}, {torch::kInt64, "I64"},   {torch::kInt32, "I32"},
    {torch::kInt16, "I16"},     {torch::kInt8, "I8"},     {torch::kUInt8, "U8"},
    {torch::kBool, "BOOL"},
};

bool parse_dtype(const std::string& name, torch::ScalarType* dtype) {
  for (const auto& d : kDtypes)
    if (name == d.name) {
      *dtype = d.dtype;
      return true;
    }
  return false;
}

std::string shape_string(c10::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// One tensor of the header, validated against the data section.
struct Entry {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // relative to the data section
};

struct Header {
  std::vector<Entry> entries;  // sorted by begin
  std::map<std::string, std::string> metadata;
};

// The header's JSON: valid, an object, and no key twice in one object (nlohmann keeps the last
// copy of a duplicate; refused here instead).
json parse_header_json(const std::string& text, const std::string& source) {
  // One set of keys per open object. The callback only observes; the first duplicate is reported
  // after the parse.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const json::parser_callback_t watch = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty() && parsed.is_string()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json root = json::parse(text, watch, /*allow_exceptions=*/false);
  CEMFRAC_CHECK(!root.is_discarded(), "{}: corrupted safetensors header (not valid JSON)", source);
  CEMFRAC_CHECK(duplicate.empty(),
                "{}: corrupted safetensors header: key '{}' appears twice in one JSON object",
                source, duplicate);
  CEMFRAC_CHECK(root.is_object(), "{}: corrupted safetensors header (JSON is not an object)",
                source);
  return root;
}

// One tensor's entry: a known dtype, a shape of sane size, and data_offsets that hold exactly its
// bytes.
Entry parse_entry(const std::string& name, const json& value, const std::string& source) {
  CEMFRAC_CHECK(value.is_object() && value.contains("dtype") && value.contains("shape") &&
                    value.contains("data_offsets"),
                "{}: tensor '{}' lacks dtype, shape or data_offsets in the header", source, name);
  Entry e;
  e.name = name;
  const json& dtype = value["dtype"];
  CEMFRAC_CHECK(dtype.is_string() && parse_dtype(dtype.get<std::string>(), &e.dtype),
                "{}: tensor '{}' has unknown dtype {} (supported: F64 F32 F16 BF16 I64 I32 I16 I8 "
                "U8 BOOL)",
                source, name, dtype.dump());
  const json& shape = value["shape"];
  CEMFRAC_CHECK(shape.is_array(), "{}: tensor '{}' shape is not an array", source, name);
  unsigned __int128 numel = 1;
  unsigned __int128 extent = 1;  // the product of the nonzero dims: a zero must not hide a huge dim
  for (const json& d : shape) {
    CEMFRAC_CHECK(d.is_number_unsigned(), "{}: tensor '{}' has a bad dimension {} in its shape",
                  source, name, d.dump());
    e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    numel *= d.get<uint64_t>();
    extent *= std::max<uint64_t>(d.get<uint64_t>(), 1);
    CEMFRAC_CHECK(extent <= (static_cast<unsigned __int128>(1) << 62),
                  "{}: tensor '{}' shape {} is absurdly large", source, name, shape.dump());
  }
  const json& offsets = value["data_offsets"];
  CEMFRAC_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                    offsets[1].is_number_unsigned(),
                "{}: tensor '{}' data_offsets {} is not a pair of byte offsets", source, name,
                offsets.dump());
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  CEMFRAC_CHECK(e.begin <= e.end, "{}: tensor '{}' data_offsets [{}, {}] end before they begin",
                source, name, e.begin, e.end);
  const unsigned __int128 bytes = numel * c10::elementSize(e.dtype);
  CEMFRAC_CHECK(bytes == e.end - e.begin,
                "{}: tensor '{}' shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {}",
                source, name, shape.dump(), dtype.get<std::string>(), static_cast<uint64_t>(bytes),
                e.begin, e.end, e.end - e.begin);
  return e;
}

// The entries, sorted by offset, tile the data section: no overlap, no gap, nothing after.
void check_coverage(std::vector<Entry>& entries, uint64_t data_size, const std::string& source) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (const Entry& e : entries) {
    CEMFRAC_CHECK(e.begin >= covered,
                  "{}: tensor '{}' data_offsets [{}, {}] overlap another tensor", source, e.name,
                  e.begin, e.end);
    CEMFRAC_CHECK(e.begin == covered,
                  "{}: a gap of {} bytes in the data section before tensor '{}' (corrupted header)",
                  source, e.begin - covered, e.name);
    CEMFRAC_CHECK(e.end <= data_size,
                  "{}: tensor '{}' ends at data byte {} but the data section has only {} bytes "
                  "(truncated file?)",
                  source, e.name, e.end, data_size);
    covered = e.end;
  }
  CEMFRAC_CHECK(covered == data_size,
                "{}: {} bytes after the last tensor's data (corrupted header or trailing garbage)",
                source, data_size - covered);
}

// Parses and checks the JSON header; data_size is the number of bytes after it in the file.
Header parse_header(const std::string& text, uint64_t data_size, const std::string& source) {
  const json root = parse_header_json(text, source);
  Header header;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& value = it.value();
    if (name == "__metadata__") {
      CEMFRAC_CHECK(value.is_object(), "{}: __metadata__ is not a JSON object", source);
      for (auto m = value.begin(); m != value.end(); ++m) {
        CEMFRAC_CHECK(m.value().is_string(), "{}: __metadata__ value of '{}' is not a string",
                      source, m.key());
        header.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    header.entries.push_back(parse_entry(name, value, source));
  }
  check_coverage(header.entries, data_size, source);
  return header;
}

// Validates the 8-byte length prefix and returns the header length.
uint64_t header_length(const unsigned char prefix[8], uint64_t file_size,
                       const std::string& source) {
  uint64_t n = 0;
  std::memcpy(&n, prefix, 8);
  CEMFRAC_CHECK(
      n <= file_size - 8,
      "{}: header length {} exceeds the file size {} (not a safetensors file, or truncated)",
      source, n, file_size);
  CEMFRAC_CHECK(n >= 2,
                "{}: header length {} is too short for a JSON object (not a safetensors file)",
                source, n);
  return n;
}

// Builds the file from a validated header; read(offset_in_data, n, dst) fills dst.
SafetensorsFile materialise(Header header,
                            const std::function<void(uint64_t, uint64_t, void*)>& read) {
  SafetensorsFile file;
  file.metadata = std::move(header.metadata);
  for (const Entry& e : header.entries) {
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
    if (e.end > e.begin) read(e.begin, e.end - e.begin, t.data_ptr());
    file.tensors.emplace(e.name, std::move(t));
  }
  return file;
}

}  // namespace

const char* safetensors_dtype_name(torch::ScalarType dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d.name;
  fail("safetensors: unsupported dtype {}", c10::toString(dtype));
}

std::string encode_safetensors(const TensorMap& tensors,
                               const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    CEMFRAC_CHECK(tensor.defined(), "safetensors: tensor '{}' is undefined", name);
    CEMFRAC_CHECK(name != "__metadata__",
                  "safetensors: '__metadata__' is reserved, not a tensor name");
    torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = t.numel() * t.element_size();
    header[name] = {{"dtype", safetensors_dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(t));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  std::string out;
  out.reserve(8 + text.size() + offset);
  const uint64_t n = text.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += text;
  for (const torch::Tensor& t : data)
    out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  return out;
}

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata) {
  write_file_atomic(path, encode_safetensors(tensors, metadata));
}

SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& source) {
  CEMFRAC_CHECK(bytes.size() >= 8,
                "{}: {} bytes is too short for a safetensors file (truncated or empty)", source,
                bytes.size());
  const uint64_t n =
      header_length(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), source);
  Header header = parse_header(bytes.substr(8, n), bytes.size() - 8 - n, source);
  const char* data = bytes.data() + 8 + n;
  return materialise(std::move(header), [&](uint64_t offset, uint64_t count, void* dst) {
    std::memcpy(dst, data + offset, count);
  });
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CEMFRAC_CHECK(in.good(), "cannot read {}: {}", path, std::strerror(errno));
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  CEMFRAC_CHECK(file_size >= 8,
                "{}: {} bytes is too short for a safetensors file (truncated or empty)", path,
                file_size);
  unsigned char prefix[8];
  in.read(reinterpret_cast<char*>(prefix), 8);
  const uint64_t n = header_length(prefix, file_size, path);
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  CEMFRAC_CHECK(in.good(), "{}: cannot read the header", path);
  Header header = parse_header(text, file_size - 8 - n, path);
  const uint64_t data_start = 8 + n;
  return materialise(std::move(header), [&](uint64_t offset, uint64_t count, void* dst) {
    in.seekg(static_cast<std::streamoff>(data_start + offset));
    in.read(static_cast<char*>(dst), static_cast<std::streamsize>(count));
    CEMFRAC_CHECK(in.good(), "{}: read error at byte {}", path, data_start + offset);
  });
}

void load_into(const TensorMap& loaded, const std::vector<NamedTarget>& targets,
               const std::string& source) {
  std::vector<std::string> missing, mismatched, extra;
  std::map<std::string, bool> expected;
  for (const NamedTarget& t : targets) {
    expected[t.name] = true;
    auto it = loaded.find(t.name);
    if (it == loaded.end()) {
      missing.push_back(t.name);
    } else if (it->second.sizes() != t.target.sizes()) {
      mismatched.push_back(fmt::format("{}: file {} vs model {}", t.name,
                                       shape_string(it->second.sizes()),
                                       shape_string(t.target.sizes())));
    }
  }
  for (const auto& [name, tensor] : loaded)
    if (!expected.count(name)) extra.push_back(name);
  if (!missing.empty() || !extra.empty() || !mismatched.empty()) {
    // At most a few names per category keep the error on one readable line.
    auto list = [](const std::vector<std::string>& names) {
      constexpr size_t kShown = 6;
      std::vector<std::string> shown(names.begin(), names.begin() + std::min(names.size(), kShown));
      std::string s = fmt::format("{}", fmt::join(shown, ", "));
      if (names.size() > kShown) s += fmt::format(", ... ({} in all)", names.size());
      return s;
    };
    std::vector<std::string> parts;
    if (!missing.empty()) parts.push_back("missing tensors: " + list(missing));
    if (!extra.empty()) parts.push_back("unexpected tensors: " + list(extra));
    if (!mismatched.empty()) parts.push_back("shape mismatches: " + list(mismatched));
    fail("{} does not match the model ({}); was it written for another architecture?", source,
         fmt::join(parts, "; "));
  }
  for (const NamedTarget& t : targets) {
    const torch::Tensor& from = loaded.at(t.name);
    CEMFRAC_CHECK(from.scalar_type() == t.target.scalar_type(),
                  "{}: tensor '{}' is {} but the model's is {}: cemfrac reads its own dtype only "
                  "and converts nothing (docs/formats.md)",
                  source, t.name, safetensors_dtype_name(from.scalar_type()),
                  safetensors_dtype_name(t.target.scalar_type()));
  }
  torch::NoGradGuard no_grad;
  for (const NamedTarget& t : targets) t.target.copy_(loaded.at(t.name));
}

void check_finite(const TensorMap& tensors, const std::string& source, bool allow_inf) {
  for (const auto& [name, t] : tensors) {
    if (!t.is_floating_point() || t.numel() == 0) continue;
    const torch::Tensor bad =
        (allow_inf ? torch::isnan(t) : torch::isfinite(t).logical_not()).reshape({-1});
    const int64_t count = bad.sum().item<int64_t>();
    if (count == 0) continue;
    const int64_t first = bad.nonzero().min().item<int64_t>();
    fail(
        "{}: tensor '{}' holds {} {} value(s), the first at flat index {} ({}): the weights are "
        "corrupt or the run diverged; use an earlier checkpoint",
        source, name, count, allow_inf ? "NaN" : "non-finite (NaN or Inf)", first,
        t.reshape({-1})[first].item<double>());
  }
}

}  // namespace cemfrac
