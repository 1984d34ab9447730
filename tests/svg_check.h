// A minimal XML well-formedness check, enough for the SVGs cemfrac writes (io/plot.h), and the
// series read back from one: what the plot tests and the compare suite tests look at. A malformed
// document is a test failure (ADD_FAILURE) naming where.
#pragma once
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <string>
#include <vector>

namespace cemfrac::test {

struct XmlElement {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::vector<int> children;  // indices into the element list
  int parent = -1;
};

// Parses `text` into elements (index 0 is the root); fails the test on any malformation.
inline std::vector<XmlElement> parse_xml(const std::string& text) {
  std::vector<XmlElement> out;
  std::vector<int> stack;
  size_t i = 0;
  auto fail_at = [&](const std::string& why) {
    ADD_FAILURE() << "XML: " << why << " at offset " << i;
    out.clear();
    return out;
  };
  auto check_text = [&](const std::string& t) {  // character data: only known entities
    for (size_t k = 0; k < t.size(); ++k) {
      if (t[k] == '<') return false;
      if (t[k] == '&') {
        const size_t semi = t.find(';', k);
        if (semi == std::string::npos) return false;
        const std::string e = t.substr(k, semi - k + 1);
        if (e != "&amp;" && e != "&lt;" && e != "&gt;" && e != "&quot;" && e != "&apos;")
          return false;
      }
    }
    return true;
  };
  while (i < text.size()) {
    const size_t lt = text.find('<', i);
    if (lt == std::string::npos) {
      if (!check_text(text.substr(i))) return fail_at("bad character data");
      break;
    }
    if (!check_text(text.substr(i, lt - i))) return fail_at("bad character data");
    if (lt > i && stack.empty() &&
        text.substr(i, lt - i).find_first_not_of(" \n\r\t") != std::string::npos)
      return fail_at("text outside the root");
    i = lt;
    if (text.compare(i, 5, "<?xml") == 0) {
      const size_t end = text.find("?>", i);
      if (end == std::string::npos || !out.empty()) return fail_at("bad declaration");
      i = end + 2;
      continue;
    }
    const size_t gt = text.find('>', i);
    if (gt == std::string::npos) return fail_at("unclosed tag");
    std::string tag = text.substr(i + 1, gt - i - 1);
    i = gt + 1;
    if (!tag.empty() && tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (stack.empty() || out[stack.back()].name != name)
        return fail_at("mismatched </" + name + ">");
      stack.pop_back();
      continue;
    }
    const bool self_closing = !tag.empty() && tag.back() == '/';
    if (self_closing) tag.pop_back();
    static const std::regex name_re(R"(^([A-Za-z_][\w.-]*))");
    std::smatch m;
    if (!std::regex_search(tag, m, name_re)) return fail_at("bad element name");
    XmlElement e;
    e.name = m[1];
    std::string rest = tag.substr(m[0].length());
    static const std::regex attr_re(R"(^\s+([A-Za-z_][\w.:-]*)=\"([^\"<]*)\")");
    while (std::regex_search(rest, m, attr_re)) {
      if (!check_text(m[2])) return fail_at("bad attribute value");
      if (!e.attrs.emplace(m[1], m[2]).second)
        return fail_at("duplicate attribute " + std::string(m[1]));
      rest = rest.substr(m[0].length());
    }
    if (rest.find_first_not_of(" \n\t") != std::string::npos)
      return fail_at("bad attributes: " + rest);
    if (stack.empty() && !out.empty()) return fail_at("second root element");
    e.parent = stack.empty() ? -1 : stack.back();
    out.push_back(e);
    const int idx = static_cast<int>(out.size()) - 1;
    if (e.parent >= 0) out[e.parent].children.push_back(idx);
    if (!self_closing) stack.push_back(idx);
  }
  if (!stack.empty()) return fail_at("unclosed <" + out[stack.back()].name + ">");
  if (out.empty() || out[0].name != "svg") ADD_FAILURE() << "XML: root is not <svg>";
  return out;
}

// series name -> number of points (<circle class="point">) in it.
inline std::map<std::string, int> svg_series(const std::string& svg) {
  std::map<std::string, int> series;
  const auto els = parse_xml(svg);
  for (const XmlElement& e : els) {
    if (e.name != "g" || e.attrs.count("class") == 0 || e.attrs.at("class") != "series") continue;
    int points = 0;
    for (int c : e.children)
      if (els[c].name == "circle" && els[c].attrs.count("class") &&
          els[c].attrs.at("class") == "point")
        ++points;
    series[e.attrs.at("data-name")] = points;
  }
  return series;
}

}  // namespace cemfrac::test
