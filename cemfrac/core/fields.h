// Small helpers over visit_fields() structs (ModelConfig, TrainConfig, ...): the visitors that read and
// write TOML / JSON live beside the formats (model_config.cpp, run_config.cpp); these are shared.
#pragma once
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cemfrac {

// The first thing wrong with a config: the key it concerns (for the file:line of the message) and a
// one-line message naming the key, the value and what is allowed.
struct ConfigProblem {
  std::string key;
  std::string message;
};

// True for structs that declare their fields with visit_fields(Visitor&).
template <typename T, typename = void>
struct HasVisitFields : std::false_type {};
struct FieldsProbe {
  template <typename F>
  void operator()(const char*, F&, const char*) {}
};
template <typename T>
struct HasVisitFields<T, std::void_t<decltype(std::declval<T&>().visit_fields(
                             std::declval<FieldsProbe&>()))>> : std::true_type {};

struct FieldNameCollector {
  std::vector<std::string> names;
  template <typename F>
  void operator()(const char* key, F&, const char*) {
    names.emplace_back(key);
  }
};

// The keys of a visit_fields() struct, in declaration order.
template <typename T>
std::vector<std::string> field_names() {
  FieldNameCollector collector;
  T probe{};
  probe.visit_fields(collector);
  return collector.names;
}

}  // namespace cemfrac
