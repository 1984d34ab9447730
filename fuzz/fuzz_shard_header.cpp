// Token shards (cemfrac/data/shard.h): the input is a whole shard file. ShardReader opens it
// (header checks), then every accessor the loader and verify() use runs on what it accepted. Each
// input is tried twice: as given, and with both CRC-32 fields recomputed, so the mutations also
// reach the checks behind the header checksum.
#include <algorithm>
#include <cstring>
#include <vector>

#include "cemfrac/data/shard.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace cemfrac;

void exercise(const std::string& path, const ShardExpectation& expect) {
  fuzz::expect_clean([&] {
    ShardReader reader(path, expect);
    const uint64_t n = reader.size();
    const uint64_t bytes = n * static_cast<uint64_t>(reader.dtype());
    FUZZ_REQUIRE(bytes / static_cast<uint64_t>(reader.dtype()) ==
                 n);  // no overflow past the checks
    if (n > 0) {
      (void)reader.at(0);
      (void)reader.at(n - 1);
      const uint64_t count = std::min<uint64_t>(n, 64);
      std::vector<int64_t> out(count);
      reader.copy_to(n - count, count, out.data());
      for (int64_t id : out) FUZZ_REQUIRE(id >= 0);
    }
    if (reader.dtype() == TokenDtype::kUint16) {
      (void)reader.data_u16();
    } else {
      (void)reader.data_u32();
    }
    fuzz::expect_clean([&] { (void)reader.at(n); });  // out of range: an Error
    reader.verify();
    // verify() passed: every token is below the vocabulary size, as the loader relies on.
    for (TokenId id : reader.to_vector()) FUZZ_REQUIRE(id >= 0 && id < reader.header().vocab_size);
  });
}

void put_u32(std::string& s, size_t offset, uint32_t v) {
  std::memcpy(&s[offset], &v, 4);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch_dir() + "/test.bin";
  std::string bytes(fuzz::as_text(data, size));
  fuzz::write_bytes(path, bytes);
  exercise(path, {});
  if (bytes.size() >= kShardHeaderSize) {
    put_u32(bytes, 112,
            crc32_update(0, bytes.data() + kShardHeaderSize, bytes.size() - kShardHeaderSize));
    put_u32(bytes, 124, crc32_update(0, bytes.data(), 124));
    fuzz::write_bytes(path, bytes);
    exercise(path, {});
    exercise(path, ShardExpectation{257, "byte"});
  }
  return 0;
}
