// safetensors writer/reader: round trips of every dtype, the byte layout of the standard format,
// and a clear one-line error for every kind of damaged file.
#include "cemfrac/io/safetensors.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstring>
#include <limits>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>

#include "cemfrac/core/check.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

using json = nlohmann::json;

// A file from a hand-written header and data section.
std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

// Expects decode_safetensors(bytes) to throw one line that names the source and contains `what`.
void expect_error(const std::string& bytes, const std::string& what) {
  SCOPED_TRACE(what);
  try {
    decode_safetensors(bytes, "damaged.safetensors");
    ADD_FAILURE() << "no error for a file that should be rejected (" << what << ")";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("damaged.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line error: " << msg;
  }
}

TEST(Safetensors, RoundTripsEveryDtypeBitwise) {
  TensorMap in;
  in["f64"] = torch::randn({3, 2}, torch::kFloat64);
  in["f32"] = torch::randn({4, 5});
  in["f16"] = torch::randn({7}).to(torch::kFloat16);
  in["bf16"] = torch::randn({2, 3}).to(torch::kBFloat16);
  in["i64"] = torch::tensor({int64_t{-1}, int64_t{1} << 40, int64_t{7}});
  in["i32"] = torch::tensor({-5, 6}, torch::kInt32);
  in["u8"] = torch::tensor({0, 255, 17}, torch::kUInt8);
  in["bool"] = torch::tensor({true, false, true});
  in["scalar"] = torch::tensor(3.5);                        // shape []
  in["empty"] = torch::zeros({0, 3});                       // zero bytes
  in["strided"] = torch::arange(12.0).reshape({3, 4}).t();  // non-contiguous input
  const std::string dir = test::temp_dir("safetensors");
  const std::string path = dir + "/t.safetensors";
  save_safetensors(path, in, {{"format", "pt"}, {"note", "x"}});
  const SafetensorsFile out = load_safetensors(path);
  EXPECT_EQ(out.metadata.at("format"), "pt");
  EXPECT_EQ(out.metadata.at("note"), "x");
  ASSERT_EQ(out.tensors.size(), in.size());
  for (const auto& [name, t] : in) {
    SCOPED_TRACE(name);
    const torch::Tensor& u = out.tensors.at(name);
    EXPECT_EQ(u.scalar_type(), t.scalar_type());
    EXPECT_EQ(u.sizes(), t.sizes());
    EXPECT_TRUE(torch::equal(u, t.contiguous()));
  }
}

TEST(Safetensors, WritesTheStandardLayout) {
  TensorMap in;
  in["b"] = torch::tensor({1.0f, 2.0f});
  in["a"] = torch::tensor({int32_t{7}}, torch::kInt32);
  const std::string bytes = encode_safetensors(in, {{"k", "v"}});
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "data section is 8-byte aligned";
  const json header = json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["k"], "v");
  // Name order: "a" (4 bytes) then "b" (8 bytes).
  EXPECT_EQ(header["a"]["dtype"], "I32");
  EXPECT_EQ(header["a"]["shape"], json::array({1}));
  EXPECT_EQ(header["a"]["data_offsets"], json::array({0, 4}));
  EXPECT_EQ(header["b"]["dtype"], "F32");
  EXPECT_EQ(header["b"]["data_offsets"], json::array({4, 12}));
  EXPECT_EQ(bytes.size(), 8 + n + 12);
  float b1 = 0;
  std::memcpy(&b1, bytes.data() + 8 + n + 4 + 4, 4);
  EXPECT_EQ(b1, 2.0f);
}

TEST(Safetensors, ReadsAHandWrittenFile) {
  // As another writer (huggingface's) would lay it out: no padding, different key order.
  const float v[2] = {1.5f, -2.0f};
  const std::string file = make_file(R"({"w":{"data_offsets":[0,8],"shape":[2],"dtype":"F32"}})",
                                     std::string(reinterpret_cast<const char*>(v), 8));
  const SafetensorsFile f = decode_safetensors(file, "hand.safetensors");
  EXPECT_TRUE(torch::equal(f.tensors.at("w"), torch::tensor({1.5f, -2.0f})));
  EXPECT_TRUE(f.metadata.empty());
}

TEST(Safetensors, RejectsDamagedFiles) {
  TensorMap in;
  in["a"] = torch::ones({2, 2});
  in["b"] = torch::ones({3});
  const std::string good = encode_safetensors(in);
  uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);

  expect_error("", "too short");
  expect_error(good.substr(0, 5), "too short");
  expect_error(good.substr(0, 8 + n / 2), "exceeds the file size");            // header cut
  expect_error(good.substr(0, good.size() - 3), "truncated");                  // data cut
  expect_error(good + "xyz", "after the last tensor");                         // trailing bytes
  expect_error("CEMFTOKS" + std::string(200, '\0'), "exceeds the file size");  // another format
  std::string not_json = good;
  not_json[8] = '[';
  expect_error(not_json, "not valid JSON");
  expect_error(make_file("[1, 2]", ""), "not an object");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1]}})", "...."), "lacks dtype");
  expect_error(make_file(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", "...."),
               "unknown dtype");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "...."),
               "bad dimension");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "...."),
               "needs 8 bytes");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "...."),
               "end before they begin");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("v":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                         "........"),
               "overlap");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "........"),
               "gap");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", ".."),
               "truncated");
  expect_error(make_file(R"({"__metadata__":{"a":1}})", ""), "not a string");
  // A length prefix that overflows when added to 8.
  std::string huge(16, '\xff');
  expect_error(huge, "exceeds the file size");
}

TEST(Safetensors, MissingFileIsAClearError) {
  try {
    load_safetensors("/nonexistent/x.safetensors");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.safetensors"), std::string::npos);
  }
}

TEST(Safetensors, LoadFileErrorsNameThePath) {
  const std::string path = test::temp_dir("safetensors_bad") + "/cut.safetensors";
  TensorMap in;
  in["a"] = torch::ones({64});
  const std::string good = encode_safetensors(in);
  test::write_file(path, good.substr(0, good.size() - 10));
  try {
    load_safetensors(path);
    FAIL() << "no error for a truncated file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, LoadIntoCopiesByName) {
  TensorMap file;
  file["x"] = torch::full({2, 3}, 4.0);
  file["y"] = torch::arange(4.0);
  torch::Tensor x = torch::zeros({2, 3}, torch::requires_grad());
  torch::Tensor y = torch::zeros({4});
  load_into(file, {{"y", y}, {"x", x}}, "m.safetensors");
  EXPECT_TRUE(torch::equal(x, file["x"]));
  EXPECT_TRUE(torch::equal(y, file["y"]));
}

TEST(Safetensors, LoadIntoReportsMissingExtraAndMismatchedByName) {
  TensorMap file;
  file["x"] = torch::ones({2, 3});
  file["extra"] = torch::ones({1});
  file["z"] = torch::ones({5});
  torch::Tensor x = torch::zeros({2, 3});
  torch::Tensor z = torch::zeros({4});
  torch::Tensor w = torch::zeros({1});
  try {
    load_into(file, {{"x", x}, {"z", z}, {"w", w}}, "m.safetensors");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("m.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing tensors: w"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected tensors: extra"), std::string::npos) << msg;
    EXPECT_NE(msg.find("z: file [5] vs model [4]"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_EQ(x.sum().item<double>(), 0.0) << "nothing is copied when the names do not match";
}

// Another dtype is refused by name, never converted.
TEST(Safetensors, LoadIntoRefusesAnotherDtype) {
  TensorMap file;
  file["w"] = torch::arange(6, torch::kInt32).reshape({2, 3});
  torch::Tensor w = torch::zeros({2, 3});
  try {
    load_into(file, {{"w", w}}, "m.safetensors");
    FAIL() << "an I32 tensor was converted into the F32 parameter";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m.safetensors: tensor 'w' is I32 but the model's is F32"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(w.sum().item<double>(), 0.0) << "nothing was copied";
}

// A key twice in one object of the header (the JSON parser would keep the last) is refused.
TEST(Safetensors, RefusesDuplicateKeys) {
  auto file = [](const std::string& header) {
    std::string bytes(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(bytes.data(), &n, 8);
    return bytes + header + std::string(8, '\0');
  };
  const std::string one = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NO_THROW(decode_safetensors(file(one), "ok.safetensors"));
  const std::string twice =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  const std::string inner =
      R"({"a":{"dtype":"I32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string meta =
      R"({"__metadata__":{"k":"1","k":"2"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  for (const auto& [header, key] : std::vector<std::pair<std::string, std::string>>{
           {twice, "a"}, {inner, "dtype"}, {meta, "k"}}) {
    try {
      decode_safetensors(file(header), "dup.safetensors");
      FAIL() << "accepted " << header;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dup.safetensors: corrupted safetensors header: key '" +
                                           key + "' appears twice"),
                std::string::npos)
          << e.what();
    }
  }
}

// Item 8: NaN is refused in every floating tensor, Inf unless allowed (buffers); integers pass.
TEST(Safetensors, CheckFiniteNamesTheTensorAndTheFirstBadIndex) {
  TensorMap t;
  t["a"] = torch::zeros({3, 4});
  t["b"] = torch::zeros({5});
  t["n"] = torch::full({2}, int64_t{7});
  EXPECT_NO_THROW(check_finite(t, "m.safetensors"));
  t["b"][2] = std::numeric_limits<float>::infinity();
  t["b"][4] = std::numeric_limits<float>::quiet_NaN();
  try {
    check_finite(t, "m.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m.safetensors: tensor 'b' holds 2 non-finite (NaN or "
                                         "Inf) value(s), the first at flat index 2"),
              std::string::npos)
        << e.what();
  }
  try {
    check_finite(t, "buffers.safetensors", /*allow_inf=*/true);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("tensor 'b' holds 1 NaN value(s), the first at flat index 4"),
        std::string::npos)
        << e.what();
  }
  t["b"][4] = 0.0f;
  EXPECT_NO_THROW(check_finite(t, "buffers.safetensors", /*allow_inf=*/true));
}

}  // namespace
}  // namespace cemfrac

namespace cemfrac {
namespace {

// Found by fuzz/fuzz_safetensors.cpp (fuzz/corpus/safetensors/crash-zero-and-huge-dim): a zero dim
// made the element count 0, so a dim of 2^64 - 1 passed the size check and reached torch::empty as
// -1, which threw c10::Error ("internal error") instead of the one-line error.
TEST(Safetensors, HugeDimBesideAZeroDimIsAClearError) {
  expect_error(
      make_file(R"({"z":{"dtype":"F32","shape":[0,18446744073709551615],"data_offsets":[0,0]}})",
                ""),
      "absurdly large");
  expect_error(
      make_file(R"({"z":{"dtype":"F32","shape":[4611686018427387905,0],"data_offsets":[0,0]}})",
                ""),
      "absurdly large");
  expect_error(
      make_file(R"({"z":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})",
                ""),
      "absurdly large");
  // Zero-sized tensors with ordinary dims still load.
  const SafetensorsFile f = decode_safetensors(
      make_file(R"({"z":{"dtype":"F32","shape":[3,0,5],"data_offsets":[0,0]}})", ""), "ok");
  EXPECT_EQ(f.tensors.at("z").sizes(), torch::IntArrayRef({3, 0, 5}));
}

}  // namespace
}  // namespace cemfrac
