#include "core/base/user_name.h"

#include <pwd.h>

namespace gpuckpt {

std::string UserNameOrUid(uint32_t uid) {
  passwd entry{};
  passwd* found = nullptr;
  char buffer[4096];
  if (getpwuid_r(uid, &entry, buffer, sizeof buffer, &found) == 0 && found != nullptr)
    return found->pw_name;
  return std::to_string(uid);
}

}  // namespace gpuckpt
