// Run configs as TOML (toml++). Three generic visitors over visit_fields(): a reader that knows the
// file:line of every value (or the --set text it came from), a writer that prints `key = value  #
// help`, and the key collector of cemfrac/core/fields.h for unknown-key checks.
#include "cemfrac/train/run_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "cemfrac/core/check.h"
#include "cemfrac/core/device.h"
#include "cemfrac/core/fields.h"
#include "cemfrac/core/warn.h"
#include "cemfrac/io/toml_file.h"

namespace cemfrac {

namespace {

const std::vector<std::string> kSections = {"model", "data", "train", "eval"};

// Where values come from: a file (messages say file:line) or one --set override (messages quote
// it).
struct Origin {
  std::string file;
  std::string override_text;  // "section.key=value" when the values come from --set
  std::string override_flag = "--set";  // how messages name where override_text came from
};

std::string locate(const toml::source_region& source, const Origin& origin) {
  if (!origin.override_text.empty()) return origin.override_flag + " " + origin.override_text;
  return fmt::format("{}:{}", origin.file, source.begin.line);
}

// A string as a TOML basic string: quoted, escaped.
std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          out += fmt::format("\\u{:04X}", ch);
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

// A node as TOML text, for messages: "abc" (quoted), 12, [1, 2], { a = 1 }.
std::string node_text(const toml::node& node) {
  if (node.is_string()) return toml_string(node.as_string()->get());
  std::ostringstream os;
  node.visit([&](auto&& n) {
    if constexpr (toml::is_table<decltype(n)>) {
      os << toml::toml_formatter(n, toml::format_flags::none);
    } else {
      os << n;
    }
  });
  std::string text = os.str();
  for (char& ch : text) {
    if (ch == '\n') ch = ' ';
  }
  return text;
}

using Locations = std::map<std::string, std::string>;  // "train.steps" -> "file:line"

void check_keys(const toml::table& table, const std::vector<std::string>& known,
                const std::string& prefix, const Origin& origin) {
  const std::set<std::string> known_set(known.begin(), known.end());
  for (auto&& [key, node] : table) {
    (void)node;
    const std::string name(key.str());
    CEMFRAC_CHECK(known_set.count(name), "{}: unknown key '{}{}'; known keys: {}",
                  locate(key.source(), origin), prefix, name, fmt::join(known, ", "));
  }
}

struct TomlReader {
  const toml::table& table;
  std::string prefix;  // "model." (or "model.layer_overrides[0].")
  const Origin& origin;
  Locations& locations;

  template <typename T>
  void operator()(const char* key, T& field, const char*, OnCheckpoint = OnCheckpoint::kFixed) {
    const toml::node* node = table.get(key);
    if (node == nullptr) return;
    const std::string name = prefix + key;
    locations[name] = locate(node->source(), origin);
    read(*node, name, field);
  }

  [[noreturn]] void wrong(const toml::node& node, const std::string& name,
                          const char* expected) const {
    fail("{}: {} = {}: expected {}", locate(node.source(), origin), name, node_text(node),
         expected);
  }
  void read(const toml::node& node, const std::string& name, int64_t& out) const {
    if (!node.is_integer()) wrong(node, name, "an integer");
    out = node.as_integer()->get();
  }
  void read(const toml::node& node, const std::string& name, uint64_t& out) const {
    if (!node.is_integer() || node.as_integer()->get() < 0)
      wrong(node, name, "a non-negative integer");
    out = static_cast<uint64_t>(node.as_integer()->get());
  }
  void read(const toml::node& node, const std::string& name, double& out) const {
    if (node.is_floating_point()) {
      out = node.as_floating_point()->get();
    } else if (node.is_integer()) {
      out = static_cast<double>(node.as_integer()->get());
    } else {
      wrong(node, name, "a number");
    }
  }
  void read(const toml::node& node, const std::string& name, bool& out) const {
    if (!node.is_boolean()) wrong(node, name, "true or false");
    out = node.as_boolean()->get();
  }
  void read(const toml::node& node, const std::string& name, std::string& out) const {
    if (!node.is_string()) wrong(node, name, "a string (in quotes)");
    out = node.as_string()->get();
  }
  template <typename E, std::enable_if_t<HasEnumNames<E>::value, int> = 0>
  void read(const toml::node& node, const std::string& name, E& out) const {
    if (!node.is_string()) wrong(node, name, "a string (in quotes)");
    const std::optional<E> value = enum_from_name<E>(node.as_string()->get());
    if (!value) {
      fail("{}: {} = {}: unknown; valid: {}", locate(node.source(), origin), name, node_text(node),
           enum_names_text<E>());
    }
    out = *value;
  }
  template <typename T>
  void read(const toml::node& node, const std::string& name, std::vector<T>& out) const {
    if (!node.is_array()) wrong(node, name, "an array");
    out.clear();
    const toml::array& array = *node.as_array();
    for (size_t i = 0; i < array.size(); ++i) {
      T item{};
      read(array[i], fmt::format("{}[{}]", name, i), item);
      out.push_back(std::move(item));
    }
  }
  template <typename T, typename = std::enable_if_t<HasVisitFields<T>::value>>
  void read(const toml::node& node, const std::string& name, T& out) const {
    if (!node.is_table()) wrong(node, name, "a table ({ key = value, ... })");
    read_table(*node.as_table(), name + ".", origin, locations, out);
  }

  template <typename T>
  static void read_table(const toml::table& table, const std::string& prefix, const Origin& origin,
                         Locations& locations, T& out) {
    check_keys(table, field_names<T>(), prefix, origin);
    TomlReader reader{table, prefix, origin, locations};
    out.visit_fields(reader);
  }
};

// Reads the sections present in `doc` into `config`.
void read_document(const toml::table& doc, const Origin& origin, Locations& locations,
                   RunConfig& config) {
  for (auto&& [key, node] : doc) {
    const std::string section(key.str());
    const std::string where = locate(key.source(), origin);
    auto known = std::find(kSections.begin(), kSections.end(), section);
    CEMFRAC_CHECK(known != kSections.end(), "{}: unknown section [{}]; valid sections: {}", where,
                  section, fmt::join(kSections, ", "));
    CEMFRAC_CHECK(node.is_table(),
                  "{}: '{}' must be a section ([{}] followed by key = value lines)", where, section,
                  section);
    const toml::table& table = *node.as_table();
    if (section == "model")
      TomlReader::read_table(table, "model.", origin, locations, config.model);
    if (section == "data") TomlReader::read_table(table, "data.", origin, locations, config.data);
    if (section == "train")
      TomlReader::read_table(table, "train.", origin, locations, config.train);
    if (section == "eval") TomlReader::read_table(table, "eval.", origin, locations, config.eval);
  }
}

bool is_name(const std::string& s) {
  if (s.empty()) return false;
  for (char ch : s) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_')) return false;
  }
  return true;
}

// "section.key=value" or "section.table.key=value" (a field of a nested table such as model.cem):
// the value is TOML (20, 3e-4, true, "text", [..]); text that is not TOML is taken as a string, so
// --set model.mixer=mha works without quotes.
void apply_override(const std::string& text, Locations& locations, RunConfig& config,
                    const std::string& flag = "--set") {
  const size_t eq = text.find('=');
  const std::string lhs = eq == std::string::npos ? text : text.substr(0, eq);
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = lhs.find('.', start);
    parts.push_back(lhs.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  CEMFRAC_CHECK(eq != std::string::npos && parts.size() >= 2 &&
                    std::all_of(parts.begin(), parts.end(), is_name),
                "{} {}: expected section.key=value (e.g. {} train.steps=20)", flag, text, flag);
  const std::string section = parts.front();
  const std::string key = lhs.substr(section.size() + 1);  // dotted: a key of a nested table
  const std::string value = text.substr(eq + 1);
  toml::table doc;
  if (auto parsed =
          try_parse_toml_text(fmt::format("[{}]\n{} = {}\n", section, key, value), flag)) {
    doc = std::move(*parsed);
  } else {
    toml::table inner{{parts.back(), value}};
    for (size_t i = parts.size() - 2; i >= 1; --i)
      inner = toml::table{{parts[i], std::move(inner)}};
    doc = toml::table{{section, std::move(inner)}};
  }
  read_document(doc, Origin{"", text, flag}, locations, config);
}

std::optional<ConfigProblem> problem(const std::string& key, std::string message) {
  return ConfigProblem{key, std::move(message)};
}

}  // namespace

std::optional<ConfigProblem> train_config_problem(const TrainConfig& t, int64_t context) {
  auto need = [](bool ok, const char* key, std::string message) -> std::optional<ConfigProblem> {
    if (ok) return std::nullopt;
    return problem(std::string("train.") + key, "train." + message);
  };
  const int64_t seq_len = t.seq_len > 0 ? t.seq_len : context;
  const std::optional<ConfigProblem> checks[] = {
      need(t.steps >= 1, "steps", fmt::format("steps = {}: must be at least 1", t.steps)),
      need(t.micro_batch >= 1, "micro_batch",
           fmt::format("micro_batch = {}: must be at least 1", t.micro_batch)),
      need(t.seq_len >= 0 && (context <= 0 || t.seq_len <= context), "seq_len",
           fmt::format("seq_len = {}: must be in 0..model.context = {} (0 = the context)",
                       t.seq_len, context)),
      need(
          t.tokens_per_step >= 0 && (t.micro_batch < 1 || seq_len < 1 ||
                                     t.tokens_per_step % (t.micro_batch * seq_len) == 0),
          "tokens_per_step",
          fmt::format("tokens_per_step = {}: must be a multiple of micro_batch * seq_len = {} * {} "
                      "(0 = one micro-batch)",
                      t.tokens_per_step, t.micro_batch, seq_len)),
      need(std::isfinite(t.lr_max) && t.lr_max > 0, "lr_max",
           fmt::format("lr_max = {}: must be a positive number", t.lr_max)),
      need(std::isfinite(t.lr_min) && t.lr_min >= 0 && t.lr_min <= t.lr_max, "lr_min",
           fmt::format("lr_min = {}: must be in 0..lr_max = {}", t.lr_min, t.lr_max)),
      need(t.warmup_steps >= 0, "warmup_steps",
           fmt::format("warmup_steps = {}: must not be negative", t.warmup_steps)),
      need(std::isfinite(t.weight_decay) && t.weight_decay >= 0, "weight_decay",
           fmt::format("weight_decay = {}: must not be negative", t.weight_decay)),
      need(t.beta1 >= 0 && t.beta1 < 1, "beta1",
           fmt::format("beta1 = {}: must be in [0, 1)", t.beta1)),
      need(t.beta2 >= 0 && t.beta2 < 1, "beta2",
           fmt::format("beta2 = {}: must be in [0, 1)", t.beta2)),
      need(std::isfinite(t.adam_eps) && t.adam_eps > 0, "adam_eps",
           fmt::format("adam_eps = {}: must be a positive number", t.adam_eps)),
      need(std::isfinite(t.grad_clip) && t.grad_clip >= 0, "grad_clip",
           fmt::format("grad_clip = {}: must not be negative (0 = off)", t.grad_clip)),
      need(t.log_every >= 1, "log_every",
           fmt::format("log_every = {}: must be at least 1", t.log_every)),
      need(t.eval_every >= 0, "eval_every",
           fmt::format("eval_every = {}: must not be negative (0 = at the end)", t.eval_every)),
      need(t.eval_tokens >= 0, "eval_tokens",
           fmt::format("eval_tokens = {}: must not be negative (0 = whole split)", t.eval_tokens)),
      need(t.checkpoint_every >= 0, "checkpoint_every",
           fmt::format("checkpoint_every = {}: must not be negative (0 = at the end)",
                       t.checkpoint_every)),
      need(t.keep_checkpoints >= 1, "keep_checkpoints",
           fmt::format("keep_checkpoints = {}: must be at least 1", t.keep_checkpoints)),
      need(!t.out.empty(), "out", "out = \"\": give a run directory"),
      need(is_device_name(t.device), "device",
           fmt::format("device = \"{}\": must be cpu, cuda, cuda:N or meta", t.device)),
      need(t.precision == "fp32" || t.precision == "bf16", "precision",
           fmt::format("precision = \"{}\": must be fp32 or bf16", t.precision)),
      need(!t.shard_gradients || t.shard_optimizer, "shard_gradients",
           "shard_gradients = true needs shard_optimizer = true (a rank keeps the gradients of "
           "the parameters whose optimizer state it holds)"),
  };
  for (const auto& p : checks) {
    if (p) return p;
  }
  return std::nullopt;
}

namespace {

std::optional<ConfigProblem> run_problem(const RunConfig& c) {
  if (auto p = c.model.first_problem()) return problem("model." + p->key, "model." + p->message);
  if (c.data.path.empty())
    return problem("data.path", "data.path = \"\": give a prepared dataset directory");
  if (auto p = train_config_problem(c.train, c.model.context)) return p;
  if (c.eval.stride < 0 || c.eval.stride > c.model.context) {
    return problem("eval.stride", fmt::format("eval.stride = {}: must be in 0..model.context = {} "
                                              "(0 = context / 2)",
                                              c.eval.stride, c.model.context));
  }
  return std::nullopt;
}

// ---- TOML write: `key = value  # help` ----
struct TomlWriter {
  std::vector<std::pair<std::string, std::string>> lines;  // (key = value, help)

  static std::string value(int64_t v) { return fmt::format("{}", v); }
  static std::string value(uint64_t v) { return fmt::format("{}", v); }
  static std::string value(bool v) { return v ? "true" : "false"; }
  static std::string value(const std::string& v) { return toml_string(v); }
  template <typename E, std::enable_if_t<HasEnumNames<E>::value, int> = 0>
  static std::string value(E v) {
    return toml_string(enum_name(v));
  }
  static std::string value(double v) {
    std::string text = fmt::format("{}", v);  // shortest text that reads back as the same double
    if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // stay a TOML float
    return text;
  }
  template <typename T>
  static std::string value(const std::vector<T>& items) {
    std::vector<std::string> parts;
    for (const T& item : items) parts.push_back(value(item));
    return fmt::format("[{}]", fmt::join(parts, ", "));
  }
  template <typename T, typename = std::enable_if_t<HasVisitFields<T>::value>>
  static std::string value(const T& item) {
    TomlWriter nested;
    T copy = item;
    copy.visit_fields(nested);
    std::vector<std::string> parts;
    for (const auto& line : nested.lines) parts.push_back(line.first);
    return fmt::format("{{ {} }}", fmt::join(parts, ", "));
  }

  template <typename T>
  void operator()(const char* key, T& field, const char* help,
                  OnCheckpoint = OnCheckpoint::kFixed) {
    lines.emplace_back(fmt::format("{} = {}", key, value(field)), help);
  }
};

template <typename T>
void write_section(std::string& out, const char* name, T config) {
  TomlWriter writer;
  config.visit_fields(writer);
  // Comments line up after the ordinary `key = value` lines; a long one (an inline table such as
  // model.cem) does not push every other comment to its width.
  constexpr size_t kMaxAligned = 40;
  size_t width = 0;
  for (const auto& line : writer.lines) {
    if (line.first.size() <= kMaxAligned) width = std::max(width, line.first.size());
  }
  out += fmt::format("[{}]\n", name);
  for (const auto& [text, help] : writer.lines) {
    out += fmt::format("{:<{}}  # {}\n", text, width, help);
  }
}

}  // namespace

void validate_run_config(const RunConfig& config) {
  if (auto p = run_problem(config)) fail("run config: {}", p->message);
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  // A directory, /dev/null or an empty file would parse as an empty config (every default): refuse.
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (std::filesystem::exists(status)) {
    CEMFRAC_CHECK(!std::filesystem::is_directory(status),
                  "run config {}: is a directory; give a TOML file (e.g. configs/tiny-llama.toml)",
                  path);
    CEMFRAC_CHECK(
        std::filesystem::is_regular_file(status),
        "run config {}: not a regular file; give a TOML file (e.g. configs/tiny-llama.toml)", path);
    CEMFRAC_CHECK(
        std::filesystem::file_size(path, ec) > 0,
        "run config {}: the file is empty; give a TOML file (e.g. configs/tiny-llama.toml)", path);
  }
  const toml::table doc = parse_toml_file(path, "run config");
  RunConfig config;
  Locations locations;
  read_document(doc, Origin{path, ""}, locations, config);
  if (locations.empty())
    warn("run config {} sets no field (only comments or empty sections): every default applies",
         path);
  for (const std::string& text : overrides) apply_override(text, locations, config);
  if (auto p = run_problem(config)) {
    auto where = locations.find(p->key);
    // A key the file leaves at its default is reported against the file as a whole.
    fail("{}: {}", where != locations.end() ? where->second : path, p->message);
  }
  return config;
}

RunConfig with_overrides(RunConfig config, const std::vector<std::string>& overrides) {
  Locations locations;
  for (const std::string& text : overrides) apply_override(text, locations, config);
  if (auto p = run_problem(config)) {
    auto where = locations.find(p->key);
    if (where != locations.end()) fail("{}: {}", where->second, p->message);
    fail("{}", p->message);
  }
  return config;
}

void override_model_fields(ModelConfig& model, const std::vector<std::string>& overrides,
                           const std::string& flag) {
  RunConfig config;
  config.model = std::move(model);
  Locations locations;
  for (const std::string& text : overrides) {
    CEMFRAC_CHECK(text.rfind("model.", 0) == 0, "{} {}: expected model.key=value", flag, text);
    apply_override(text, locations, config, flag);
  }
  model = std::move(config.model);
}

std::string to_toml(const RunConfig& config) {
  std::string out;
  write_section(out, "model", config.model);
  out += "\n";
  write_section(out, "data", config.data);
  out += "\n";
  write_section(out, "train", config.train);
  out += "\n";
  write_section(out, "eval", config.eval);
  return out;
}

}  // namespace cemfrac
