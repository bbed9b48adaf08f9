// A uid as people read it: the user's name from the user database (NSS),
// or the uid in decimal where the database has none (a user removed since,
// a uid from another machine's pool). For display only: names are never
// compared or trusted, since two machines may name one uid differently.
//
// Thread-safety: a free function; reentrant (getpwuid_r).
#ifndef GPUCKPT_CORE_BASE_USER_NAME_H_
#define GPUCKPT_CORE_BASE_USER_NAME_H_

#include <cstdint>
#include <string>

namespace gpuckpt {

std::string UserNameOrUid(uint32_t uid);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_BASE_USER_NAME_H_
