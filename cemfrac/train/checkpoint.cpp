#include "cemfrac/train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <regex>
#include <type_traits>

#include <signal.h>
#include <unistd.h>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/warn.h"
#include "cemfrac/layers/param_tags.h"

namespace cemfrac {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

json optional_to_json(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}

// Reads a required field of trainer.json with the right JSON type.
template <typename T>
T field(const json& j, const char* key, const std::string& source) {
  CEMFRAC_CHECK(j.contains(key), "{}: missing field '{}'", source, key);
  // An integer field must hold a JSON integer: nlohmann converts a float such as 1.234e55 to an
  // integer type by a plain cast, which is undefined behaviour out of range (fuzz finding).
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    CEMFRAC_CHECK(j.at(key).is_number_integer(), "{}: field '{}' has the wrong type ({})", source,
                  key, j.at(key).dump());
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    fail("{}: field '{}' has the wrong type ({})", source, key, j.at(key).dump());
  }
}

std::optional<double> optional_field(const json& j, const char* key, const std::string& source) {
  if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
  return field<double>(j, key, source);
}

std::string value_string(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// First difference between two JSON values, as "field 'a.b' is X but ... has Y"; "" when equal.
std::string first_difference(const json& expected, const json& found, const std::string& path) {
  const std::string where = path.empty() ? "(root)" : path;
  if (expected.is_object() && found.is_object()) {
    for (auto it = expected.begin(); it != expected.end(); ++it) {
      const std::string sub = path.empty() ? it.key() : path + "." + it.key();
      if (!found.contains(it.key()))
        return fmt::format("field '{}' is missing (the run's model has {})", sub,
                           value_string(it.value()));
      std::string d = first_difference(it.value(), found.at(it.key()), sub);
      if (!d.empty()) return d;
    }
    for (auto it = found.begin(); it != found.end(); ++it)
      if (!expected.contains(it.key()))
        return fmt::format("field '{}' = {} is unknown to the run's model",
                           path.empty() ? it.key() : path + "." + it.key(),
                           value_string(it.value()));
    return "";
  }
  if (expected.is_array() && found.is_array() && expected.size() == found.size()) {
    for (size_t i = 0; i < expected.size(); ++i) {
      std::string d = first_difference(expected[i], found[i], fmt::format("{}[{}]", path, i));
      if (!d.empty()) return d;
    }
    return "";
  }
  // Numbers compare by value (1 and 1.0 are the same field value).
  if (expected.is_number() && found.is_number() && expected.get<double>() == found.get<double>())
    return "";
  if (expected == found) return "";
  return fmt::format("field '{}' is {} but the run's model has {}", where, value_string(found),
                     value_string(expected));
}

bool is_checkpoint_dir(const fs::path& p) {
  return fs::is_regular_file(p / kCheckpointTrainerFile);
}

constexpr const char* kSaveIdKey = "save_id";

// The save id of a checkpoint: FNV-1a (64 bits) of its trainer state without the wall time, so
// that it differs between any two runs or steps whose training differs (seed, data cursor, RNG
// state, settings, step) and equals between an interrupted-and-resumed run and an uninterrupted one
// (their checkpoint files stay equal bit for bit).
std::string save_id_of(const TrainerState& state) {
  json j = trainer_state_to_json(state);
  j.erase("elapsed_s");
  j.erase("save_id");
  const std::string text = j.dump();
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

// Renames `dir` to a temporary name (one clean_stale_temporaries recognises) and removes it, so
// that a kill during the removal never leaves a half-deleted step-N.
void remove_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  const std::string aside = fmt::format("{}.tmp-{}-{:x}.old", dir, static_cast<long>(::getpid()),
                                        std::random_device{}() & 0xffffffu);
  fs::rename(dir, aside, ec);
  fs::remove_all(ec ? fs::path(dir) : fs::path(aside), ec);
}

}  // namespace

std::string base64_encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v =
        (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    for (int k = 3; k >= 0; --k) out += kBase64[(v >> (6 * k)) & 63];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = uint8_t(bytes[i]) << 16;
    out += kBase64[(v >> 18) & 63];
    out += kBase64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    out += kBase64[(v >> 18) & 63];
    out += kBase64[(v >> 12) & 63];
    out += kBase64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::string base64_decode(const std::string& text, const std::string& source) {
  CEMFRAC_CHECK(text.size() % 4 == 0, "{}: base64 text of length {} is not a multiple of 4", source,
                text.size());
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i + k];
      uint32_t d = 0;
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        ++pad;
      } else {
        const char* p = c ? std::strchr(kBase64, c) : nullptr;
        CEMFRAC_CHECK(p != nullptr && pad == 0, "{}: invalid base64 character at offset {}", source,
                      i + k);
        d = static_cast<uint32_t>(p - kBase64);
      }
      v = (v << 6) | d;
    }
    out += static_cast<char>((v >> 16) & 255);
    if (pad < 2) out += static_cast<char>((v >> 8) & 255);
    if (pad < 1) out += static_cast<char>(v & 255);
  }
  return out;
}

std::string generator_state(at::Generator& gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  const torch::Tensor state = gen.get_state();  // uint8
  return base64_encode(std::string(static_cast<const char*>(state.data_ptr()), state.numel()));
}

void set_generator_state(at::Generator& gen, const std::string& base64, const std::string& source) {
  const std::string bytes = base64_decode(base64, source);
  torch::Tensor state = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
  std::lock_guard<std::mutex> lock(gen.mutex());
  try {
    gen.set_state(state);
  } catch (const c10::Error&) {
    fail("{}: the saved torch RNG state ({} bytes) is not one this LibTorch accepts", source,
         bytes.size());
  }
}

std::string torch_rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  return generator_state(gen);
}

void set_torch_rng_state(const std::string& base64, const std::string& source) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  set_generator_state(gen, base64, source);
}

std::vector<std::string> cuda_rng_states() {
  std::vector<std::string> out;
  const int64_t n = static_cast<int64_t>(torch::cuda::device_count());  // 0 without CUDA
  for (int64_t i = 0; i < n; ++i) {
    at::Generator gen = at::globalContext().defaultGenerator(
        c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
    out.push_back(generator_state(gen));
  }
  return out;
}

void set_cuda_rng_states(const std::vector<std::string>& base64, const std::string& source) {
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(torch::cuda::device_count()),
                                      static_cast<int64_t>(base64.size()));
  for (int64_t i = 0; i < n; ++i) {
    at::Generator gen = at::globalContext().defaultGenerator(
        c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
    set_generator_state(gen, base64[static_cast<size_t>(i)], source);
  }
}

json trainer_state_to_json(const TrainerState& s) {
  return json{
      {"format", kCheckpointFormat},
      {"format_version", kCheckpointFormatVersion},
      {"step", s.step},
      {"tokens", s.tokens},
      {"data_seed", s.data_seed},
      {"loader", s.loader},
      {"torch_rng", s.torch_rng},
      {"cuda_rng", s.cuda_rng},
      {"schedule",
       {{"kind", "cosine"},
        {"lr_max", s.schedule.lr_max},
        {"lr_min", s.schedule.lr_min},
        {"warmup_steps", s.schedule.warmup_steps},
        {"total_steps", s.schedule.total_steps}}},
      {"lr", s.lr},
      {"last_loss", optional_to_json(s.last_loss)},
      {"last_val_loss", optional_to_json(s.last_val_loss)},
      {"best_val_loss", optional_to_json(s.best_val_loss)},
      {"elapsed_s", s.elapsed_s},
      {"run", s.run.is_null() ? json::object() : s.run},
      {"world_size", s.world_size},
      {"recent_losses", s.recent_losses},
      {"save_id", s.save_id},
  };
}

TrainerState trainer_state_from_json(const json& j, const std::string& source) {
  CEMFRAC_CHECK(j.is_object(), "{}: not a JSON object", source);
  // Not j.value("format", ...): that throws nlohmann's type_error when 'format' is not a string.
  const auto format = j.find("format");
  CEMFRAC_CHECK(format != j.end() && format->is_string() && *format == kCheckpointFormat,
                "{}: 'format' is not \"{}\" (not a cemfrac checkpoint)", source, kCheckpointFormat);
  const int version = field<int>(j, "format_version", source);
  CEMFRAC_CHECK(
      version == kCheckpointFormatVersion,
      "{}: checkpoint format version {} is not supported (this cemfrac reads version {}); "
      "use the cemfrac that wrote it",
      source, version, kCheckpointFormatVersion);
  TrainerState s;
  s.step = field<int64_t>(j, "step", source);
  s.tokens = field<int64_t>(j, "tokens", source);
  s.data_seed = field<uint64_t>(j, "data_seed", source);
  s.loader = field<json>(j, "loader", source);
  CEMFRAC_CHECK(s.loader.is_object(), "{}: field 'loader' has the wrong type ({})", source,
                value_string(s.loader));
  s.torch_rng = field<std::string>(j, "torch_rng", source);
  if (j.contains("cuda_rng")) s.cuda_rng = field<std::vector<std::string>>(j, "cuda_rng", source);
  const json schedule = field<json>(j, "schedule", source);
  CEMFRAC_CHECK(field<std::string>(schedule, "kind", source) == "cosine",
                "{}: unknown schedule kind {}", source, schedule.at("kind").dump());
  s.schedule.lr_max = field<double>(schedule, "lr_max", source);
  s.schedule.lr_min = field<double>(schedule, "lr_min", source);
  s.schedule.warmup_steps = field<int64_t>(schedule, "warmup_steps", source);
  s.schedule.total_steps = field<int64_t>(schedule, "total_steps", source);
  s.lr = field<double>(j, "lr", source);
  s.last_loss = optional_field(j, "last_loss", source);
  s.last_val_loss = optional_field(j, "last_val_loss", source);
  s.best_val_loss = optional_field(j, "best_val_loss", source);
  s.elapsed_s = field<double>(j, "elapsed_s", source);
  // Optional (checkpoints written before it have none): the settings an exact resume needs.
  if (j.contains("run")) {
    s.run = j.at("run");
    CEMFRAC_CHECK(s.run.is_object(), "{}: field 'run' has the wrong type ({})", source,
                  value_string(s.run));
  }
  if (j.contains("world_size")) s.world_size = field<int64_t>(j, "world_size", source);
  CEMFRAC_CHECK(s.world_size >= 1, "{}: world_size {} must be at least 1", source, s.world_size);
  if (j.contains("recent_losses")) {
    s.recent_losses = field<std::vector<double>>(j, "recent_losses", source);
    CEMFRAC_CHECK(static_cast<int64_t>(s.recent_losses.size()) <= kRecentLosses,
                  "{}: {} recent losses, more than the {} kept", source, s.recent_losses.size(),
                  kRecentLosses);
  }
  if (j.contains("save_id")) s.save_id = field<std::string>(j, "save_id", source);
  CEMFRAC_CHECK(s.step >= 0 && s.tokens >= 0, "{}: negative step or token count", source);
  return s;
}

std::string checkpoint_name(int64_t step) {
  return fmt::format("step-{:06d}", step);
}

std::string checkpoints_dir(const std::string& run_dir) {
  return (fs::path(run_dir) / "checkpoints").string();
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  const fs::path dir = checkpoints_dir(run_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  static const std::regex kName("step-([0-9]+)");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, m, kName))
      out.emplace_back(std::stoll(m[1].str()), entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string save_checkpoint(const std::string& run_dir, const CheckpointContents& c, int64_t keep) {
  const std::string dir =
      (fs::path(checkpoints_dir(run_dir)) / checkpoint_name(c.trainer.step)).string();
  TrainerState trainer = c.trainer;
  trainer.save_id = save_id_of(trainer);
  const std::map<std::string, std::string> tensor_meta = {
      {"format", "pt"}, {"producer", "cemfrac"}, {kSaveIdKey, trainer.save_id}};
  std::map<std::string, std::string> optimizer_meta = c.optimizer_metadata;
  optimizer_meta[kSaveIdKey] = trainer.save_id;
  write_dir_atomic(dir, [&](const std::string& tmp) {
    const fs::path t(tmp);
    save_safetensors((t / kCheckpointModelFile).string(), c.model, tensor_meta);
    save_safetensors((t / kCheckpointOptimizerFile).string(), c.optimizer, optimizer_meta);
    if (!c.buffers.empty())
      save_safetensors((t / kCheckpointBuffersFile).string(), c.buffers, tensor_meta);
    write_file_atomic((t / kCheckpointConfigFile).string(), c.config.dump(2) + "\n");
    if (c.tokenizer) c.tokenizer->save((t / kCheckpointTokenizerDir).string());
    write_file_atomic((t / kCheckpointTrainerFile).string(),
                      trainer_state_to_json(trainer).dump(2) + "\n");
  });
  if (keep > 0) {
    // Complete checkpoints count; all but the newest `keep` go. An incomplete step-N older than
    // the oldest one kept goes too: cemfrac's saves appear complete or not at all, so it is what a
    // removal cut short left (newer incomplete ones are left alone: resolve_checkpoint names them).
    const auto all = list_checkpoints(run_dir);
    std::vector<std::pair<int64_t, std::string>> complete;
    for (const auto& e : all)
      if (checkpoint_problem(e.second).empty()) complete.push_back(e);
    const size_t drop = complete.size() > static_cast<size_t>(keep)
                            ? complete.size() - static_cast<size_t>(keep)
                            : 0;
    const int64_t oldest_kept = complete.empty() ? -1 : complete[drop].first;
    for (const auto& [step, path] : all) {
      if (path == dir || step >= oldest_kept) continue;
      remove_checkpoint_dir(path);
    }
    clean_stale_temporaries(run_dir);  // what an earlier removal cut short by a kill left
  }
  return dir;
}

std::string checkpoint_problem(const std::string& dir) {
  const fs::path d(dir);
  std::error_code ec;
  if (fs::is_directory(d, ec) && fs::is_empty(d, ec)) return "empty directory";
  for (const char* name : {kCheckpointTrainerFile, kCheckpointConfigFile, kCheckpointModelFile,
                           kCheckpointOptimizerFile}) {
    const fs::path f = d / name;
    if (!fs::is_regular_file(f, ec)) return fmt::format("{} is missing", name);
    if (fs::file_size(f, ec) == 0) return fmt::format("{} is empty", name);
  }
  const std::string path = (d / kCheckpointTrainerFile).string();
  const json j = json::parse(read_file(path), nullptr, false);
  if (j.is_discarded()) return fmt::format("{} is not valid JSON", kCheckpointTrainerFile);
  try {
    trainer_state_from_json(j, kCheckpointTrainerFile);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<std::string> clean_stale_temporaries(const std::string& run_dir) {
  std::vector<std::string> removed;
  const fs::path dir = checkpoints_dir(run_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  // core/atomic_file.cpp names temporaries <name>.tmp-<pid>-<hex> (and <...>.old when moved aside).
  static const std::regex kTemp("step-[0-9]+\\.tmp-([0-9]+)-[0-9a-f]+(\\.old)?");
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, kTemp)) continue;
    const long pid = std::stol(m[1].str());
    // A live writer other than this process keeps its temporary (two runs in one directory are
    // refused elsewhere; this only guards against removing what someone is still writing).
    if (pid != static_cast<long>(::getpid()) &&
        (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM))
      continue;
    stale.push_back(entry.path());
  }
  std::sort(stale.begin(), stale.end());
  for (const fs::path& p : stale) {
    fs::remove_all(p, ec);
    if (!ec) removed.push_back(p.string());
  }
  return removed;
}

std::string resolve_checkpoint(const std::string& path) {
  const fs::path p(path);
  CEMFRAC_CHECK(fs::is_directory(p), "--resume {}: no such directory", path);
  if (is_checkpoint_dir(p)) return p.string();
  auto found = list_checkpoints(path);
  if (found.empty() && p.filename() == "checkpoints")
    found = list_checkpoints(p.parent_path().string());
  CEMFRAC_CHECK(!found.empty(),
                "{}: neither a checkpoint (no {}) nor a run directory with checkpoints/step-*",
                path, kCheckpointTrainerFile);
  // The newest complete checkpoint; newer incomplete ones (a copy cut short, a directory made by
  // hand: cemfrac's own saves appear complete or not at all) are skipped with a warning.
  std::vector<std::string> skipped;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    const std::string problem = checkpoint_problem(it->second);
    if (problem.empty()) {
      for (const std::string& s : skipped) warn("{}; using {}", s, it->second);
      return it->second;
    }
    skipped.push_back(fmt::format("skipped incomplete checkpoint {} ({})", it->second, problem));
  }
  fail("{}: no complete checkpoint; {}", path, skipped.front());
}

void check_config_matches(const json& expected, const json& found, const std::string& source) {
  const std::string d = first_difference(expected, found, "");
  CEMFRAC_CHECK(d.empty(),
                "{}: {}; the checkpoint's architecture wins when loading, so drop the "
                "conflicting setting or start a new run directory",
                source, d);
}

Checkpoint load_checkpoint(const std::string& dir, const LoadOptions& options) {
  const fs::path d(dir);
  CEMFRAC_CHECK(fs::is_directory(d), "checkpoint {}: no such directory", dir);
  auto require = [&](const char* name) {
    const fs::path f = d / name;
    CEMFRAC_CHECK(fs::is_regular_file(f),
                  "checkpoint {}: {} is missing (incomplete or not a checkpoint)", dir, name);
    return f.string();
  };
  Checkpoint c;
  c.dir = dir;
  {
    const std::string path = require(kCheckpointTrainerFile);
    json j = json::parse(read_file(path), nullptr, false);
    CEMFRAC_CHECK(!j.is_discarded(), "{}: not valid JSON", path);
    c.trainer = trainer_state_from_json(j, path);
    // The directory's name is its step: a trainer.json of another step is another checkpoint's.
    static const std::regex kName("step-([0-9]+)");
    std::smatch m;
    const std::string name = fs::path(dir).lexically_normal().filename().string();
    if (std::regex_match(name, m, kName))
      CEMFRAC_CHECK(std::stoll(m[1].str()) == c.trainer.step,
                    "checkpoint {}: trainer.json says step {} but the directory is {}; the parts "
                    "of a checkpoint must come from one save",
                    dir, c.trainer.step, name);
  }
  // Every tensor file carries the save id trainer.json records (checkpoints without one predate
  // the check).
  auto check_part = [&](const SafetensorsFile& file, const std::string& path) {
    if (c.trainer.save_id.empty()) return;
    const auto it = file.metadata.find(kSaveIdKey);
    const std::string found = it == file.metadata.end() ? "none" : it->second;
    CEMFRAC_CHECK(found == c.trainer.save_id,
                  "{} belongs to another checkpoint (save id {}, but trainer.json says {}); the "
                  "parts of a checkpoint must come from one save",
                  path, found, c.trainer.save_id);
  };
  {
    const std::string path = require(kCheckpointConfigFile);
    c.config = json::parse(read_file(path), nullptr, false);
    CEMFRAC_CHECK(!c.config.is_discarded() && c.config.is_object(), "{}: not a JSON object", path);
    if (options.expected_config) check_config_matches(*options.expected_config, c.config, path);
  }
  // Weights and optimizer moments must be finite; buffers must not be NaN (the ladders' recorded
  // ranges legitimately start at +-Inf).
  c.model = load_safetensors(require(kCheckpointModelFile));
  check_part(c.model, require(kCheckpointModelFile));
  check_finite(c.model.tensors, require(kCheckpointModelFile));
  if (options.optimizer) {
    c.optimizer = load_safetensors(require(kCheckpointOptimizerFile));
    check_part(c.optimizer, require(kCheckpointOptimizerFile));
    check_finite(c.optimizer.tensors, require(kCheckpointOptimizerFile));
  }
  c.has_buffers = fs::is_regular_file(d / kCheckpointBuffersFile);
  if (c.has_buffers) {
    c.buffers = load_safetensors((d / kCheckpointBuffersFile).string());
    check_part(c.buffers, (d / kCheckpointBuffersFile).string());
    check_finite(c.buffers.tensors, (d / kCheckpointBuffersFile).string(), /*allow_inf=*/true);
  }
  c.has_tokenizer = fs::is_directory(d / kCheckpointTokenizerDir);
  return c;
}

void load_state_buffers(const Checkpoint& checkpoint, torch::nn::Module& module) {
  std::vector<NamedTarget> targets;
  for (const auto& [name, tensor] : state_buffers(module)) targets.push_back({name, tensor});
  const std::string source = (fs::path(checkpoint.dir) / kCheckpointBuffersFile).string();
  if (targets.empty() && !checkpoint.has_buffers) return;
  CEMFRAC_CHECK(checkpoint.has_buffers,
                "{} is missing: the model has {} state buffer(s) (e.g. '{}'); the checkpoint was "
                "written by an older cemfrac or is incomplete",
                source, targets.size(), targets.front().name);
  load_into(checkpoint.buffers.tensors, targets, source);
}

}  // namespace cemfrac
