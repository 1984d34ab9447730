#include "cemfrac/core/device.h"

#include <torch/cuda.h>

#include <cctype>
#include <string>

#include "cemfrac/core/check.h"
#include "cemfrac/core/meta_kernels.h"

namespace cemfrac {

c10::Device parse_device(const std::string& text, const std::string& source) {
  const char* kChoices = "cpu, cuda, cuda:N or meta";
  if (text == "cpu") return c10::Device(c10::kCPU);
  if (text == "meta") {
    ensure_meta_kernels();
    return c10::Device(c10::kMeta);
  }
  if (text == "cuda" || text.rfind("cuda:", 0) == 0) {
    int64_t index = 0;
    if (text.size() > 5) {
      const std::string digits = text.substr(5);
      bool ok = !digits.empty() && digits.size() <= 4;
      for (char c : digits) ok = ok && std::isdigit(static_cast<unsigned char>(c));
      CEMFRAC_CHECK(ok,
                    "{} '{}': the GPU index must be a number (cuda:0, cuda:1, ...); choices: {}",
                    source, text, kChoices);
      index = std::stoll(digits);
    } else {
      CEMFRAC_CHECK(text == "cuda", "{} '{}': expected {}", source, text, kChoices);
    }
    const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
    CEMFRAC_CHECK(count > 0,
                  "{} {}: no CUDA here (this LibTorch build has no CUDA, or no GPU is visible); "
                  "use cpu",
                  source, text);
    CEMFRAC_CHECK(index < count, "{} {}: only {} GPU(s) are visible (cuda:0..cuda:{})", source,
                  text, count, count - 1);
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  fail("{} '{}': unknown device; choices: {}", source, text, kChoices);
}

bool is_device_name(const std::string& text) {
  if (text == "cpu" || text == "meta" || text == "cuda") return true;
  if (text.rfind("cuda:", 0) != 0 || text.size() == 5 || text.size() > 9) return false;
  for (size_t i = 5; i < text.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return false;
  return true;
}

bool is_meta_read_error(const std::string& what) {
  // LibTorch's words (1.13 and 2.x) when data is asked of a meta tensor: .item() runs
  // aten::_local_scalar_dense, which has no meta kernel, as have the data-dependent ops
  // (masked_select, nonzero); a copy to the host "cannot copy out of meta tensor".
  return what.find("from the 'Meta' backend") != std::string::npos ||
         what.find("out of meta tensor") != std::string::npos ||
         what.find("on meta tensors") != std::string::npos ||
         // LibTorch 2.x: "aten::_local_scalar_dense: attempted to run this operator with Meta
         // tensors, but there was no fake impl or Meta kernel registered. ..."
         what.find("attempted to run this operator with Meta tensors") != std::string::npos;
}

std::string meta_dry_run_message(const std::string& what) {
  // "Could not run 'aten::_local_scalar_dense' with arguments from the 'Meta' backend. ..." names
  // the operator; other messages are quoted up to their first sentence.
  std::string where = what.substr(0, what.find('\n'));
  const size_t q = what.find("'aten::");
  const size_t attempted = what.find(": attempted to run this operator");
  const size_t bare =
      attempted == std::string::npos ? std::string::npos : what.rfind("aten::", attempted);
  if (q != std::string::npos) {
    const size_t end = what.find('\'', q + 1);
    where = what.substr(q + 1, end == std::string::npos ? std::string::npos : end - q - 1);
    if (where == "aten::_local_scalar_dense") where = "a tensor's value read on the host";
  } else if (bare != std::string::npos) {  // LibTorch 2.x: "aten::op: attempted to run ..."
    where = what.substr(bare, attempted - bare);
    if (where == "aten::_local_scalar_dense") where = "a tensor's value read on the host";
  } else if (const size_t dot = where.find(". "); dot != std::string::npos) {
    where = where.substr(0, dot);
  }
  return "--device meta is a dry run of shapes: everything before the first value that must be "
         "read ran; it stopped at " +
         where;
}

}  // namespace cemfrac
