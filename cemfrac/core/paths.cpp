#include "cemfrac/core/paths.h"

#include <cstdlib>
#include <filesystem>

#include "cemfrac/core/check.h"

namespace cemfrac {

std::string cache_dir() {
  if (const char* dir = std::getenv("CEMFRAC_CACHE"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/cemfrac";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/cemfrac";
}

std::string npm_package_dir(const std::string& name) {
  const std::string dir = cache_dir() + "/npm/" + name;
  CEMFRAC_CHECK(std::filesystem::exists(dir + "/package.json"),
                "npm package '{}' is not in the cache ({}): run scripts/setup.sh to fetch it", name,
                dir);
  return dir;
}

}  // namespace cemfrac
