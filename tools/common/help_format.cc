#include "tools/common/help_format.h"

#include <sstream>
#include <string>

namespace gpuckpt {
namespace {

class PlainFormatter : public CLI::Formatter {
 public:
  std::string make_option_name(const CLI::Option* option, bool is_positional) const override {
    if (is_positional) return option->get_name(true, false);
    // Every name ("-h,--help"), without the value a flag stores ("{false}").
    std::string names;
    for (const std::string& name : option->get_snames())
      names += (names.empty() ? "-" : ",-") + name;
    for (const std::string& name : option->get_lnames())
      names += (names.empty() ? "--" : ",--") + name;
    return names;
  }

  std::string make_option_opts(const CLI::Option* option) const override {
    if (!option->get_option_text().empty()) return " " + option->get_option_text();
    std::ostringstream out;
    if (option->get_type_size() != 0) {
      // The type without the validators' descriptions CLI11 appends
      // after a ':'.
      std::string type = option->get_type_name();
      type = type.substr(0, type.find(':'));
      if (!type.empty()) out << " " << type;
      if (!option->get_default_str().empty()) out << "=" << option->get_default_str();
      if (option->get_expected_max() == CLI::detail::expected_max_vector_size)
        out << " ...";
      else if (option->get_expected_min() > 1)
        out << " x " << option->get_expected();
      if (option->get_required()) out << " REQUIRED";
    }
    if (!option->get_envname().empty()) out << " (env: " << option->get_envname() << ")";
    return out.str();
  }
};

}  // namespace

std::shared_ptr<CLI::Formatter> PlainHelpFormatter() { return std::make_shared<PlainFormatter>(); }

}  // namespace gpuckpt
