// Suite files (suite.h). Keys are checked against fixed lists; values name file:line when wrong.
#include "cemfrac/compare/suite.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <toml++/toml.h>

#include "cemfrac/core/check.h"
#include "cemfrac/eval/brown_tasks.h"  // is_builtin_task
#include "cemfrac/io/toml_file.h"
#include "cemfrac/layers/registry.h"      // kNoFfn
#include "cemfrac/tasks/glue.h"           // finetune_task_names
#include "cemfrac/tasks/gp_experiment.h"  // apply_gp_variant
#include "cemfrac/train/run_config.h"

namespace cemfrac {
namespace {

struct Reader {
  std::string file;

  std::string at(const toml::node& node) const {
    return fmt::format("{}:{}", file, node.source().begin.line);
  }
  void keys(const toml::table& t, const std::string& where,
            const std::vector<std::string>& known) const {
    const std::set<std::string> k(known.begin(), known.end());
    for (auto&& [key, node] : t) {
      (void)node;
      CEMFRAC_CHECK(k.count(std::string(key.str())),
                    "{}:{}: unknown key '{}' in {}; known keys: {}", file, key.source().begin.line,
                    key.str(), where, fmt::join(known, ", "));
    }
  }
  std::string str(const toml::table& t, const char* key, const std::string& where, bool required,
                  const std::string& fallback = "") const {
    const toml::node* n = t.get(key);
    if (n == nullptr) {
      CEMFRAC_CHECK(!required, "{}: {} needs '{}'", file, where, key);
      return fallback;
    }
    CEMFRAC_CHECK(n->is_string() && !n->as_string()->get().empty(),
                  "{}: {}.{}: expected a non-empty string", at(*n), where, key);
    return n->as_string()->get();
  }
  // A name of enum E (core/fields.h EnumNames); an unknown one names the valid ones.
  template <typename E>
  E name_of(const toml::table& t, const char* key, const std::string& where, E fallback) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return fallback;
    const std::string text = str(t, key, where, true);
    const std::optional<E> v = enum_from_name<E>(text);
    CEMFRAC_CHECK(v.has_value(), "{}: {}.{} '{}': expected one of {}", at(*n), where, key, text,
                  enum_names_text<E>());
    return *v;
  }
  int64_t integer(const toml::table& t, const char* key, const std::string& where, int64_t fallback,
                  int64_t min) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return fallback;
    CEMFRAC_CHECK(n->is_integer() && n->as_integer()->get() >= min,
                  "{}: {}.{}: expected an integer >= {}", at(*n), where, key, min);
    return n->as_integer()->get();
  }
  double number(const toml::table& t, const char* key, const std::string& where,
                double fallback) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return fallback;
    CEMFRAC_CHECK(n->is_number(), "{}: {}.{}: expected a number", at(*n), where, key);
    return n->value<double>().value();
  }
  const toml::array* array(const toml::table& t, const char* key, const std::string& where) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return nullptr;
    CEMFRAC_CHECK(n->is_array(), "{}: {}.{}: expected an array", at(*n), where, key);
    return n->as_array();
  }
  std::vector<std::string> strings(const toml::table& t, const char* key,
                                   const std::string& where) const {
    std::vector<std::string> out;
    if (const toml::array* a = array(t, key, where)) {
      for (const toml::node& n : *a) {
        CEMFRAC_CHECK(n.is_string(), "{}: {}.{}: expected strings", at(n), where, key);
        out.push_back(n.as_string()->get());
      }
    }
    return out;
  }
  // A string or an array of strings.
  std::vector<std::string> names(const toml::table& t, const char* key,
                                 const std::string& where) const {
    const toml::node* n = t.get(key);
    CEMFRAC_CHECK(n != nullptr, "{}: {} needs '{}'", file, where, key);
    if (n->is_string()) return {n->as_string()->get()};
    std::vector<std::string> out = strings(t, key, where);
    CEMFRAC_CHECK(!out.empty(), "{}: {}.{}: expected a run name or a non-empty array of them",
                  at(*n), where, key);
    return out;
  }
  std::vector<double> lrs(const toml::table& t, const char* key, const std::string& where) const {
    std::vector<double> out;
    if (const toml::array* a = array(t, key, where)) {
      for (const toml::node& n : *a) {
        CEMFRAC_CHECK(
            n.is_number() && n.value<double>().value() > 0 && n.value<double>().value() < 1,
            "{}: {}.{}: expected learning rates in (0, 1)", at(n), where, key);
        out.push_back(n.value<double>().value());
      }
      CEMFRAC_CHECK(!out.empty(), "{}: {}.{}: the learning-rate grid is empty", at(*a), where, key);
    }
    return out;
  }
  std::vector<uint64_t> seeds(const toml::table& t, const char* key,
                              const std::string& where) const {
    std::vector<uint64_t> out;
    if (const toml::array* a = array(t, key, where)) {
      for (const toml::node& n : *a) {
        CEMFRAC_CHECK(n.is_integer() && n.as_integer()->get() >= 0,
                      "{}: {}.{}: expected non-negative integers", at(n), where, key);
        const auto s = static_cast<uint64_t>(n.as_integer()->get());
        CEMFRAC_CHECK(std::find(out.begin(), out.end(), s) == out.end(), "{}: {}.{}: seed {} twice",
                      at(n), where, key, s);
        out.push_back(s);
      }
      CEMFRAC_CHECK(!out.empty(), "{}: {}.{}: no seeds", at(*a), where, key);
    }
    return out;
  }
};

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          c == '='))
      return false;
  }
  return s != "." && s != "..";
}

// What [suite] gives every run that does not name its own.
struct RunDefaults {
  int64_t tokens = 0;
  std::vector<uint64_t> seeds;
  std::vector<double> lr;
  std::vector<std::string> sets;
};

// [suite]: the suite's own fields, and the defaults of its runs.
RunDefaults read_suite_table(const Reader& r, const toml::table& doc, Suite& s) {
  const std::string& path = r.file;
  const toml::table* head = doc["suite"].as_table();
  CEMFRAC_CHECK(head != nullptr, "{}: no [suite] table", path);
  r.keys(*head, "[suite]",
         {"name", "description", "data", "eval_split", "eval_text", "tasks", "tokens", "seeds",
          "lr", "lr_search_tokens", "lr_min_ratio", "val_points", "set"});
  s.name = r.str(*head, "name", "[suite]", true);
  CEMFRAC_CHECK(valid_name(s.name), "{}: [suite].name '{}': use letters, digits, '-', '_', '.'",
                path, s.name);
  s.description = r.str(*head, "description", "[suite]", false);
  s.data = r.str(*head, "data", "[suite]", false, s.data);
  s.eval_split = r.str(*head, "eval_split", "[suite]", false, s.eval_split);
  CEMFRAC_CHECK(s.eval_split == "val" || s.eval_split == "test",
                "{}: [suite].eval_split '{}': expected val or test", path, s.eval_split);
  s.eval_text = r.strings(*head, "eval_text", "[suite]");
  s.tasks = r.strings(*head, "tasks", "[suite]");
  std::set<std::string> task_keys;
  for (const std::string& t : s.tasks) {
    CEMFRAC_CHECK(is_builtin_task(t) || std::filesystem::is_regular_file(t),
                  "{}: [suite].tasks: '{}' is neither a built-in task ({}) nor a task file", path,
                  t, fmt::join(builtin_task_names(), ", "));
    CEMFRAC_CHECK(task_keys.insert(task_key(t)).second, "{}: [suite].tasks: two tasks named '{}'",
                  path, task_key(t));
  }
  RunDefaults d;
  d.tokens = r.integer(*head, "tokens", "[suite]", 0, 1);
  d.seeds = r.seeds(*head, "seeds", "[suite]");
  if (d.seeds.empty()) d.seeds = {1};
  d.lr = r.lrs(*head, "lr", "[suite]");
  s.lr_search_tokens = r.integer(*head, "lr_search_tokens", "[suite]", 0, 1);
  s.lr_min_ratio = r.number(*head, "lr_min_ratio", "[suite]", s.lr_min_ratio);
  CEMFRAC_CHECK(s.lr_min_ratio > 0 && s.lr_min_ratio <= 1,
                "{}: [suite].lr_min_ratio must be in (0, 1]", path);
  s.val_points = r.integer(*head, "val_points", "[suite]", s.val_points, 1);
  d.sets = r.strings(*head, "set", "[suite]");
  return d;
}

// [gp] (optional): what every GP run shares, within the bounds of `cemfrac gp`'s flags, so that a
// bad value fails here and not in a child.
void read_gp_table(const Reader& r, const toml::table& doc, Suite& s) {
  const toml::node* gn = doc.get("gp");
  if (gn == nullptr) return;
  const toml::table* g = gn->as_table();
  CEMFRAC_CHECK(g != nullptr, "{}: gp must be a [gp] table", r.at(*gn));
  r.keys(*g, "[gp]",
         {"steps", "search_steps", "batch", "layers", "positions", "ffn", "val_seqs", "test_seqs",
          "eval_seed", "threads"});
  s.gp.steps = r.integer(*g, "steps", "[gp]", 0, 1);
  s.gp.search_steps = r.integer(*g, "search_steps", "[gp]", 0, 1);
  s.gp.batch = r.integer(*g, "batch", "[gp]", s.gp.batch, 1);
  s.gp.layers = r.integer(*g, "layers", "[gp]", s.gp.layers, 1);
  s.gp.positions = r.str(*g, "positions", "[gp]", false, s.gp.positions);
  CEMFRAC_CHECK(s.gp.positions == "none" || s.gp.positions == "rope",
                "{}: [gp].positions '{}': expected none or rope", r.at(*g->get("positions")),
                s.gp.positions);
  s.gp.ffn = r.str(*g, "ffn", "[gp]", false, s.gp.ffn);
  CEMFRAC_CHECK(s.gp.ffn.empty() || s.gp.ffn == kNoFfn,
                "{}: [gp].ffn '{}': expected none (attention-only; leave it out for each model's "
                "own FFN)",
                r.at(*g->get("ffn")), s.gp.ffn);
  s.gp.val_seqs = r.integer(*g, "val_seqs", "[gp]", s.gp.val_seqs, 2);
  s.gp.test_seqs = r.integer(*g, "test_seqs", "[gp]", s.gp.test_seqs, 2);
  s.gp.eval_seed = static_cast<uint64_t>(
      r.integer(*g, "eval_seed", "[gp]", static_cast<int64_t>(s.gp.eval_seed), 0));
  s.gp.threads = r.integer(*g, "threads", "[gp]", s.gp.threads, 1);
  const std::pair<const char*, int64_t> bounds[] = {
      {"batch", 65536},  {"layers", 64},      {"val_seqs", 1000000},     {"test_seqs", 1000000},
      {"threads", 1024}, {"steps", 10000000}, {"search_steps", 10000000}};
  for (const auto& [key, max] : bounds)
    if (const toml::node* n = g->get(key))
      CEMFRAC_CHECK(n->as_integer()->get() <= max, "{}: [gp].{}: at most {}", r.at(*n), key, max);
}

// A run's test_time_steps: a variant "T=k" per value (an LM run's sets model.cem.steps; a GP job
// evaluates its model at k itself).
void read_test_time_steps(const Reader& r, const toml::table& t, const std::string& where, bool gp,
                          SuiteRun& run) {
  const toml::array* steps = r.array(t, "test_time_steps", where);
  if (steps == nullptr) return;
  for (const toml::node& n : *steps) {
    CEMFRAC_CHECK(n.is_integer() && n.as_integer()->get() >= 1 && n.as_integer()->get() <= 64,
                  "{}: {}.test_time_steps: expected integers in 1..64", r.at(n), where);
    const int64_t k = n.as_integer()->get();
    std::vector<std::string> sets;
    if (!gp) sets.push_back(fmt::format("model.cem.steps={}", k));
    run.variants.push_back({fmt::format("T={}", k), sets, k});
  }
}

// A run with a grid needs that grid's budget; a run without lr_from needs a learning rate.
void check_lr(const Reader& r, const toml::node& node, const std::string& where,
              const SuiteRun& run, bool has_search_budget, const char* budget_key) {
  if (!run.lr_from.empty()) return;
  CEMFRAC_CHECK(!run.lr.empty(), "{}: {}: no learning rate ([suite].lr, the run's lr or lr_from)",
                r.at(node), where);
  CEMFRAC_CHECK(run.lr.size() == 1 || has_search_budget, "{}: {}: a learning-rate grid {}needs {}",
                r.at(node), where, run.task == SuiteTask::kGp ? "of a GP run " : "", budget_key);
}

// The keys of a task = "gp" run: model, reading, T, budget, depth, FFN, test-time T.
void read_gp_run(const Reader& r, const toml::table& t, const toml::node& node, const Suite& s,
                 const std::string& where, SuiteRun& run) {
  SuiteGpRun& g = run.gp;
  g.model = r.name_of(t, "model", where, g.model);
  if (g.model == GpModelKind::kLlama) {
    for (const char* k : {"variant", "T", "test_time_steps"})
      CEMFRAC_CHECK(t.get(k) == nullptr,
                    "{}: {}: key '{}' is for CEM models; model = \"llama\" has no steps T",
                    r.at(*t.get(k)), where, k);
  }
  g.variant = r.str(t, "variant", where, false, g.variant);
  g.variant_at = t.get("variant") ? r.at(*t.get("variant")) : r.at(node);
  if (g.model == GpModelKind::kCem) {
    try {  // an unknown reading of the recursion fails here, before anything trains
      ModelConfig probe;
      apply_gp_variant(probe, g.variant);
    } catch (const Error& e) {
      fail("{}: run '{}': {}", g.variant_at, run.name, e.what());
    }
  }
  g.T = r.integer(t, "T", where, g.T, 1);
  CEMFRAC_CHECK(g.T <= 64, "{}: {}.T = {}: expected 1..64", r.at(*t.get("T")), where, g.T);
  g.steps = r.integer(t, "steps", where, s.gp.steps, 1);
  CEMFRAC_CHECK(g.steps <= 10000000, "{}: {}.steps: at most 10000000", r.at(*t.get("steps")),
                where);
  CEMFRAC_CHECK(g.steps > 0, "{}: {}: no step budget ([gp].steps or the run's steps)", r.at(node),
                where);
  g.layers = r.integer(t, "layers", where, s.gp.layers, 1);
  CEMFRAC_CHECK(g.layers <= 64, "{}: {}.layers: at most 64", r.at(*t.get("layers")), where);
  g.ffn = r.str(t, "ffn", where, false, s.gp.ffn);
  CEMFRAC_CHECK(g.ffn.empty() || g.ffn == kNoFfn,
                "{}: {}.ffn '{}': expected none (attention-only; leave it out for the model's "
                "own FFN)",
                r.at(*t.get("ffn")), where, g.ffn);
  check_lr(r, node, where, run, s.gp.search_steps > 0, "[gp].search_steps");
  read_test_time_steps(r, t, where, true, run);
}

// The keys of a task = "lm" run: its config and overrides (which must load now, not hours later),
// budget, test-time T and variants.
void read_lm_run(const Reader& r, const toml::table& t, const toml::node& node, const Suite& s,
                 const RunDefaults& d, const std::string& where, SuiteRun& run) {
  run.config = r.str(t, "config", where, true);
  CEMFRAC_CHECK(std::filesystem::is_regular_file(run.config),
                "{}: {}: config '{}' not found (paths are relative to the working directory)",
                r.at(node), where, run.config);
  run.sets = d.sets;
  for (const std::string& x : r.strings(t, "set", where)) run.sets.push_back(x);
  run.tokens = r.integer(t, "tokens", where, d.tokens, 1);
  CEMFRAC_CHECK(run.tokens > 0, "{}: {}: no token budget ([suite].tokens or the run's tokens)",
                r.at(node), where);
  check_lr(r, node, where, run, s.lr_search_tokens > 0, "[suite].lr_search_tokens");
  read_test_time_steps(r, t, where, false, run);
  if (const toml::array* vs = r.array(t, "variants", where)) {
    for (const toml::node& n : *vs) {
      const toml::table* vt = n.as_table();
      CEMFRAC_CHECK(vt != nullptr,
                    "{}: {}.variants: expected inline tables {{ name = ..., set = [...] }}",
                    r.at(n), where);
      r.keys(*vt, where + ".variants", {"name", "set"});
      SuiteVariant v;
      v.name = r.str(*vt, "name", where + ".variants", true);
      v.sets = r.strings(*vt, "set", where + ".variants");
      CEMFRAC_CHECK(!v.sets.empty(), "{}: {}: variant '{}' sets nothing", r.at(n), where, v.name);
      run.variants.push_back(v);
    }
  }
}

// One [[run]]: the keys both tasks share, then its task's (keys of the other task are refused by
// name, not ignored); its variant names are valid and distinct.
SuiteRun read_run(const Reader& r, const toml::node& node, const Suite& s, const RunDefaults& d,
                  std::set<std::string>& names) {
  const toml::table* t = node.as_table();
  CEMFRAC_CHECK(t != nullptr, "{}: run must be [[run]] tables", r.at(node));
  r.keys(*t, "[[run]]",
         {"name", "task", "config", "set", "tokens", "seeds", "lr", "lr_from", "test_time_steps",
          "variants", "model", "variant", "T", "steps", "layers", "ffn"});
  SuiteRun run;
  run.name = r.str(*t, "name", "[[run]]", true);
  const std::string where = fmt::format("run '{}'", run.name);
  CEMFRAC_CHECK(valid_name(run.name) && run.name.find('@') == std::string::npos,
                "{}: run name '{}': use letters, digits, '-', '_', '.', '='", r.at(node), run.name);
  CEMFRAC_CHECK(names.insert(run.name).second, "{}: two runs named '{}'", r.at(node), run.name);
  run.task = r.name_of(*t, "task", where, run.task);
  const std::vector<std::string> lm_only = {"config", "set", "tokens", "variants"};
  const std::vector<std::string> gp_only = {"model", "variant", "T", "steps", "layers", "ffn"};
  for (const std::string& k : run.task == SuiteTask::kGp ? lm_only : gp_only) {
    const toml::node* n = t->get(k);
    CEMFRAC_CHECK(n == nullptr, "{}: {}: key '{}' is for task = \"{}\" runs, this one is \"{}\"",
                  r.at(*n), where, k, run.task == SuiteTask::kGp ? "lm" : "gp",
                  enum_name(run.task));
  }
  run.seeds = r.seeds(*t, "seeds", where);
  if (run.seeds.empty()) run.seeds = d.seeds;
  run.lr = r.lrs(*t, "lr", where);
  if (run.lr.empty()) run.lr = d.lr;
  run.lr_from = r.str(*t, "lr_from", where, false);
  if (run.task == SuiteTask::kGp)
    read_gp_run(r, *t, node, s, where, run);
  else
    read_lm_run(r, *t, node, s, d, where, run);
  std::set<std::string> vnames;
  for (const SuiteVariant& v : run.variants) {
    CEMFRAC_CHECK(valid_name(v.name),
                  "{}: {}: variant name '{}': use letters, digits, '-', '_', '.', '='", r.at(node),
                  where, v.name);
    CEMFRAC_CHECK(vnames.insert(v.name).second, "{}: {}: two variants named '{}'", r.at(node),
                  where, v.name);
  }
  if (run.task == SuiteTask::kLm) {
    try {
      (void)load_run_config(run.config, run.sets);
    } catch (const Error& e) {
      fail("{}: {}: {}", r.at(node), where, e.what());
    }
  }
  return run;
}

// lr_from names a run of the same task that chooses its own learning rate.
void check_lr_from(const Suite& s) {
  for (const SuiteRun& run : s.runs) {
    if (run.lr_from.empty()) continue;
    const bool exists = std::any_of(s.runs.begin(), s.runs.end(),
                                    [&](const SuiteRun& o) { return o.name == run.lr_from; });
    CEMFRAC_CHECK(exists, "{}: run '{}': lr_from '{}' names no run", s.path, run.name, run.lr_from);
    CEMFRAC_CHECK(s.run(run.lr_from).lr_from.empty(),
                  "{}: run '{}': lr_from '{}' must name a run that chooses its own learning rate",
                  s.path, run.name, run.lr_from);
    CEMFRAC_CHECK(s.run(run.lr_from).task == run.task,
                  "{}: run '{}': lr_from '{}' names a run of another task", s.path, run.name,
                  run.lr_from);
  }
}

// One [[finetune]].
SuiteFinetune read_finetune(const Reader& r, const toml::node& node, std::set<std::string>& names) {
  const toml::table* t = node.as_table();
  CEMFRAC_CHECK(t != nullptr, "{}: fine-tunings must be [[finetune]] tables", r.at(node));
  r.keys(*t, "[[finetune]]", {"name", "task", "data", "seeds", "lr", "epochs", "batch", "max_len"});
  SuiteFinetune f;
  f.name = r.str(*t, "name", "[[finetune]]", true);
  CEMFRAC_CHECK(valid_name(f.name),
                "{}: [[finetune]].name '{}': use letters, digits, '-', '_', '.'", r.at(node),
                f.name);
  CEMFRAC_CHECK(names.insert(f.name).second, "{}: two [[finetune]] tables named '{}'", r.at(node),
                f.name);
  const std::string where = fmt::format("finetune '{}'", f.name);
  f.task = r.str(*t, "task", where, true);
  const std::vector<std::string>& known = finetune_task_names();
  CEMFRAC_CHECK(std::find(known.begin(), known.end(), f.task) != known.end(),
                "{}: {}: task '{}': expected one of {}", r.at(node), where, f.task,
                fmt::join(known, ", "));
  f.data = r.str(*t, "data", where, false);
  if (f.task == "brown-genre") {
    CEMFRAC_CHECK(f.data.empty(), "{}: {}: brown-genre is built in: no data", r.at(node), where);
  } else {
    CEMFRAC_CHECK(!f.data.empty() && std::filesystem::is_directory(f.data),
                  "{}: {}: task {} needs data = the task's folder of TSV files{}", r.at(node),
                  where, f.task, f.data.empty() ? "" : " ('" + f.data + "' is not a folder)");
  }
  if (const auto seeds = r.seeds(*t, "seeds", where); !seeds.empty()) f.seeds = seeds;
  f.lr = r.number(*t, "lr", where, f.lr);
  CEMFRAC_CHECK(f.lr > 0 && f.lr < 1, "{}: {}.lr must be in (0, 1)", r.at(node), where);
  f.epochs = r.number(*t, "epochs", where, f.epochs);
  CEMFRAC_CHECK(f.epochs > 0, "{}: {}.epochs must be > 0", r.at(node), where);
  f.batch = r.integer(*t, "batch", where, f.batch, 1);
  f.max_len = r.integer(*t, "max_len", where, f.max_len, 0);
  return f;
}

// A claim's rows name runs of one task (returned).
SuiteTask check_claim_rows(const Reader& r, const toml::node& node, const std::string& where,
                           const Suite& s, const SuiteClaim& c) {
  std::vector<std::string> rows = c.a;
  rows.push_back(c.b);
  std::optional<SuiteTask> task;
  for (const std::string& row : rows) {
    const std::string name = split_row(row).first;
    const bool exists = std::any_of(s.runs.begin(), s.runs.end(),
                                    [&](const SuiteRun& o) { return o.name == name; });
    CEMFRAC_CHECK(exists, "{}: {}: '{}' names no run", r.at(node), where, row);
    const SuiteTask row_task = s.run(name).task;
    CEMFRAC_CHECK(!task || *task == row_task,
                  "{}: {}: '{}' is a {} run, '{}' a {} run: a claim compares runs of one task",
                  r.at(node), where, rows.front(), task ? enum_name(*task) : "", row,
                  enum_name(row_task));
    task = row_task;
  }
  return *task;
}

void check_claim_variants(const Reader& r, const toml::node& node, const std::string& where,
                          const Suite& s, const SuiteClaim& c, bool gp) {
  std::vector<std::string> rows = c.a;
  rows.push_back(c.b);
  const std::string variant_metric = gp ? "test_rmse" : "test_loss";
  for (const std::string& row : rows) {
    const auto [name, variant] = split_row(row);
    if (variant.empty()) continue;
    bool found = false;
    for (const SuiteVariant& v : s.run(name).variants) found = found || v.name == variant;
    CEMFRAC_CHECK(found, "{}: {}: run '{}' has no test-time variant '{}'", r.at(node), where, name,
                  variant);
    CEMFRAC_CHECK(c.metric == variant_metric,
                  "{}: {}: a test-time variant has only {} (the {} set)", r.at(node), where,
                  variant_metric, gp ? "GP test" : s.eval_split);
  }
}

// One [[claim]], against the runs already read.
SuiteClaim read_claim(const Reader& r, const toml::node& node, const Suite& s,
                      std::set<std::string>& ids) {
  const toml::table* t = node.as_table();
  CEMFRAC_CHECK(t != nullptr, "{}: claims must be [[claim]] tables", r.at(node));
  r.keys(*t, "[[claim]]", {"id", "text", "source", "a", "b", "test", "margin", "metric"});
  SuiteClaim c;
  c.id = r.str(*t, "id", "[[claim]]", true);
  CEMFRAC_CHECK(ids.insert(c.id).second, "{}: two claims with id '{}'", r.at(node), c.id);
  const std::string where = fmt::format("claim '{}'", c.id);
  c.text = r.str(*t, "text", where, true);
  c.source = r.str(*t, "source", where, false);
  c.a = r.names(*t, "a", where);
  c.b = r.str(*t, "b", where, true);
  c.test = r.name_of(*t, "test", where, c.test);
  c.margin = r.number(*t, "margin", where, 0.0);
  CEMFRAC_CHECK(c.margin >= 0, "{}: {}: margin must be >= 0", r.at(node), where);
  CEMFRAC_CHECK(c.test == ClaimTest::kNotWorse || c.margin == 0,
                "{}: {}: margin is only for test = not_worse", r.at(node), where);
  const bool gp = check_claim_rows(r, node, where, s, c) == SuiteTask::kGp;
  c.metric = r.str(*t, "metric", where, false, gp ? "test_rmse" : c.metric);
  if (gp) {
    CEMFRAC_CHECK(
        c.metric == "test_rmse" || c.metric == "val_rmse" || c.metric == "test_rmse_targets",
        "{}: {}: metric '{}' for GP runs: expected test_rmse, val_rmse or test_rmse_targets",
        r.at(node), where, c.metric);
  } else {
    const bool text_metric = c.metric.rfind("text_loss:", 0) == 0;
    const auto [kind, name] = downstream_metric(c.metric);
    CEMFRAC_CHECK(c.metric == "test_loss" || c.metric == "val_loss" || text_metric || !kind.empty(),
                  "{}: {}: metric '{}': expected test_loss, val_loss, text_loss:<file stem>, "
                  "task_error:<task>, task_error_norm:<task> or finetune_error:<finetune>",
                  r.at(node), where, c.metric);
    if (kind == "finetune_error") {
      CEMFRAC_CHECK(std::any_of(s.finetunes.begin(), s.finetunes.end(),
                                [&](const SuiteFinetune& f) { return f.name == name; }),
                    "{}: {}: metric '{}' names no [[finetune]]", r.at(node), where, c.metric);
    } else if (!kind.empty()) {
      CEMFRAC_CHECK(std::any_of(s.tasks.begin(), s.tasks.end(),
                                [&](const std::string& t) { return task_key(t) == name; }),
                    "{}: {}: metric '{}' names no task of [suite].tasks", r.at(node), where,
                    c.metric);
    }
  }
  check_claim_variants(r, node, where, s, c, gp);
  return c;
}

}  // namespace

std::pair<std::string, std::string> split_row(const std::string& row) {
  const auto at = row.find('@');
  if (at == std::string::npos) return {row, ""};
  return {row.substr(0, at), row.substr(at + 1)};
}

std::string task_key(const std::string& task) {
  if (is_builtin_task(task)) return task;
  return std::filesystem::path(task).stem().string();
}

std::pair<std::string, std::string> downstream_metric(const std::string& metric) {
  for (const char* kind : {"task_error", "task_error_norm", "finetune_error"}) {
    const std::string prefix = std::string(kind) + ":";
    if (metric.rfind(prefix, 0) == 0 && metric.size() > prefix.size())
      return {kind, metric.substr(prefix.size())};
  }
  return {"", ""};
}

bool Suite::has_task(SuiteTask task) const {
  for (const SuiteRun& r : runs)
    if (r.task == task) return true;
  return false;
}

const SuiteRun& Suite::run(const std::string& name) const {
  for (const SuiteRun& r : runs)
    if (r.name == name) return r;
  fail("suite {}: no run named '{}'", path, name);
}

Suite load_suite(const std::string& path) {
  CEMFRAC_CHECK(std::filesystem::is_regular_file(path), "cannot read suite {}: no such file", path);
  const toml::table doc = parse_toml_file(path, "suite");
  const Reader r{path};
  r.keys(doc, "the suite file", {"suite", "gp", "run", "finetune", "claim"});
  Suite s;
  s.path = path;
  const RunDefaults defaults = read_suite_table(r, doc, s);
  read_gp_table(r, doc, s);
  const toml::array* runs = r.array(doc, "run", "the suite file");
  CEMFRAC_CHECK(runs != nullptr && !runs->empty(), "{}: no [[run]] tables", path);
  std::set<std::string> names;
  for (const toml::node& node : *runs) s.runs.push_back(read_run(r, node, s, defaults, names));
  check_lr_from(s);
  if (const toml::array* finetunes = r.array(doc, "finetune", "the suite file")) {
    std::set<std::string> ft_names;
    for (const toml::node& node : *finetunes)
      s.finetunes.push_back(read_finetune(r, node, ft_names));
  }
  CEMFRAC_CHECK((s.tasks.empty() && s.finetunes.empty()) || s.has_task(SuiteTask::kLm),
                "{}: [suite].tasks and [[finetune]] apply to LM runs; the suite has none", path);
  if (const toml::array* claims = r.array(doc, "claim", "the suite file")) {
    std::set<std::string> ids;
    for (const toml::node& node : *claims) s.claims.push_back(read_claim(r, node, s, ids));
  }
  return s;
}

}  // namespace cemfrac
