// Small helpers over visit_fields() structs (ModelConfig, TrainConfig, ...): the visitors that read
// and write TOML / JSON live beside the formats (model_config.cpp, run_config.cpp); these are
// shared.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "cemfrac/core/check.h"

namespace cemfrac {

// The first thing wrong with a config: the key it concerns (for the file:line of the message) and a
// one-line message naming the key, the value and what is allowed.
struct ConfigProblem {
  std::string key;
  std::string message;
};

// Whether a field may change when a checkpoint is loaded (eval / generate `--set`): the fourth,
// optional argument of a visit_fields() line. kMayChange only for fields that change no parameter's
// shape or meaning, e.g. CEM's step count T (test-time scaling: --set model.cem.steps=4).
enum class OnCheckpoint { kFixed, kMayChange };

// Enum-valued fields. A field whose values are a fixed set of names is an enum with a name table,
// specialised next to the enum:
//   template <> struct EnumNames<Positions> {
//     static constexpr std::array<std::pair<Positions, const char*>, 3> kNames = {
//         {{Positions::kLearned, "learned"}, {Positions::kRope, "rope"}, {Positions::kNone,
//         "none"}}};
//   };
// The visitors read the name from TOML / JSON once, when the config is loaded (an unknown name is
// an error there, listing kNames in order), and write the name back, so files keep the same
// strings.
template <typename E>
struct EnumNames {};

template <typename E, typename = void>
struct HasEnumNames : std::false_type {};
template <typename E>
struct HasEnumNames<E, std::void_t<decltype(EnumNames<E>::kNames)>> : std::true_type {};

template <typename E>
const char* enum_name(E value) {
  for (const auto& [v, name] : EnumNames<E>::kNames) {
    if (v == value) return name;
  }
  return "?";
}

template <typename E>
std::optional<E> enum_from_name(std::string_view name) {
  for (const auto& [v, n] : EnumNames<E>::kNames) {
    if (name == n) return v;
  }
  return std::nullopt;
}

// "learned, rope, none": the valid names, for messages.
template <typename E>
std::string enum_names_text() {
  std::string text;
  for (const auto& [v, name] : EnumNames<E>::kNames) {
    (void)v;
    if (!text.empty()) text += ", ";
    text += name;
  }
  return text;
}

// Name -> value for names that do not come through a config file (flags, tests); an unknown name
// throws cemfrac::Error in the readers' words: `what = "name": unknown; valid: a, b`.
template <typename E>
E parse_enum(const std::string& name, const std::string& what) {
  if (auto v = enum_from_name<E>(name)) return *v;
  fail("{} = \"{}\": unknown; valid: {}", what, name, enum_names_text<E>());
}

// True for structs that declare their fields with visit_fields(Visitor&).
template <typename T, typename = void>
struct HasVisitFields : std::false_type {};
struct FieldsProbe {
  template <typename F>
  void operator()(const char*, F&, const char*, OnCheckpoint = OnCheckpoint::kFixed) {}
};
template <typename T>
struct HasVisitFields<
    T, std::void_t<decltype(std::declval<T&>().visit_fields(std::declval<FieldsProbe&>()))>>
    : std::true_type {};

struct FieldNameCollector {
  std::vector<std::string> names;
  template <typename F>
  void operator()(const char* key, F&, const char*, OnCheckpoint = OnCheckpoint::kFixed) {
    names.emplace_back(key);
  }
};

// Dotted keys ("cem.steps") of the fields marked OnCheckpoint::kMayChange, nested structs included.
struct MayChangeCollector {
  std::string prefix;
  std::vector<std::string>* out;
  template <typename F>
  void operator()(const char* key, F& field, const char*, OnCheckpoint use = OnCheckpoint::kFixed) {
    if (use == OnCheckpoint::kMayChange) out->push_back(prefix + key);
    if constexpr (HasVisitFields<F>::value) {
      MayChangeCollector nested{prefix + key + ".", out};
      field.visit_fields(nested);
    }
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

// The keys of a visit_fields() struct that may change on a loaded checkpoint, in declaration order.
template <typename T>
std::vector<std::string> fields_that_may_change_on_checkpoint() {
  std::vector<std::string> keys;
  MayChangeCollector collector{"", &keys};
  T probe{};
  probe.visit_fields(collector);
  return keys;
}

}  // namespace cemfrac
