# Text as a CMake list of its lines, and back, for the man page scripts
# (help2man.cmake, md2man.cmake). CMake lists split at ';' and treat
# brackets specially: while text is a list, ';', '[' and ']' stand as the
# control characters ${semicolon}, ${open_bracket} and ${close_bracket}
# (so a script's patterns name brackets by these), and restore_characters()
# puts them back.
string(ASCII 1 semicolon)
string(ASCII 2 open_bracket)
string(ASCII 3 close_bracket)

# The lines of `text`, as the list `out`.
function(text_to_lines out text)
  string(REPLACE ";" "${semicolon}" text "${text}")
  string(REPLACE "[" "${open_bracket}" text "${text}")
  string(REPLACE "]" "${close_bracket}" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()

# `text` with ';', '[' and ']' back in place of their stand-ins.
function(restore_characters out text)
  string(REPLACE "${semicolon}" ";" text "${text}")
  string(REPLACE "${open_bracket}" "[" text "${text}")
  string(REPLACE "${close_bracket}" "]" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()
