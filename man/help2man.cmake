# Runs help2man on one built program (cmake -P; see man/CMakeLists.txt):
#
#   cmake -DHELP2MAN=... -DPROGRAM=... -DSECTION=1 -DSUBCOMMANDS=ON|OFF
#         -DINCLUDE=man/NAME.h2m -DOUTPUT=build/man/NAME.1 -P help2man.cmake
#
# INCLUDE is help2man's include file: hand-written (man/gpuckpt.h2m) or
# made from a manual by md2man.cmake (build/man/gpuckptfs.h2m).
# help2man reads the program's --help (and the release from --version). With SUBCOMMANDS, the
# subcommands that --help lists get a COMMANDS section made here from each
# one's own --help (help2man itself reads only the top level). The page is
# written under a temporary name and renamed into place, so a failed run
# leaves no half page behind. A default that --help computes from this
# machine (gpuckptfs's staging memory) is written in words instead.
get_filename_component(name ${PROGRAM} NAME)

include(${CMAKE_CURRENT_LIST_DIR}/text_lines.cmake)

# The lines of `PROGRAM ARGS... --help`, in the list `out` (text_lines.cmake;
# roff_text() puts the stand-in characters back).
function(help_lines out)
  execute_process(COMMAND ${PROGRAM} ${ARGN} --help OUTPUT_VARIABLE text RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${PROGRAM} ${ARGN} --help failed")
  endif()
  text_to_lines(lines "${text}")
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()

# `text` as roff: backslashes and minus signs escaped, a leading '.' or
# quote made literal, the replaced characters put back.
function(roff_text out text)
  string(REPLACE "\\" "\\e" text "${text}")
  string(REPLACE "-" "\\-" text "${text}")
  string(REGEX REPLACE "^([.'])" "\\\\&\\1" text "${text}")
  restore_characters(text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

set(includes "")
if(SUBCOMMANDS)
  # The names under "Subcommands:" in the top-level --help.
  help_lines(lines)
  set(subcommands "")
  set(in_list OFF)
  foreach(line IN LISTS lines)
    if(line MATCHES "^Subcommands:")
      set(in_list ON)
    elseif(in_list AND line MATCHES "^  ([a-z][a-z-]*)")
      list(APPEND subcommands ${CMAKE_MATCH_1})
    elseif(NOT line MATCHES "^ ")
      set(in_list OFF)
    endif()
  endforeach()
  if(NOT subcommands)
    message(FATAL_ERROR "${PROGRAM} --help lists no subcommands")
  endif()

  # One .SS per subcommand: its summary, its usage, and a .TP per
  # positional and option (CLI11 puts a long one's text on the next line).
  set(roff "[COMMANDS]\n")
  foreach(sub IN LISTS subcommands)
    help_lines(lines ${sub})
    string(APPEND roff ".SS \"${name} ${sub}\"\n")
    set(first ON)
    foreach(line IN LISTS lines)
      if(first)
        roff_text(line "${line}")
        string(APPEND roff "${line}\n.PP\n")
        set(first OFF)
      elseif(line MATCHES "^Usage: [^ ]+ (.*)$")
        roff_text(usage "${CMAKE_MATCH_1}")
        string(APPEND roff ".B ${name} ${usage}\n")
      elseif(line MATCHES "^([A-Z][a-z]+):$")
        string(APPEND roff ".PP\n${CMAKE_MATCH_1}:\n")
      elseif(line MATCHES "^  ([^ ].*[^ ]) [ ]+([^ ].*)$")
        roff_text(term "${CMAKE_MATCH_1}")
        roff_text(text "${CMAKE_MATCH_2}")
        string(APPEND roff ".TP\n.B ${term}\n${text}\n")
      elseif(line MATCHES "^  ([^ ].*)$")
        roff_text(term "${CMAKE_MATCH_1}")
        string(APPEND roff ".TP\n.B ${term}\n")
      elseif(line MATCHES "^ +([^ ].*)$")
        roff_text(text "${CMAKE_MATCH_1}")
        string(APPEND roff "${text}\n")
      endif()
    endforeach()
  endforeach()
  file(WRITE ${OUTPUT}.commands.h2m "${roff}")
  list(APPEND includes --include=${OUTPUT}.commands.h2m)
endif()
# (After COMMANDS: the sections that are neither help2man's own nor
# standard come in the order they are first met.)
list(APPEND includes --include=${INCLUDE})

# NAME and SYNOPSIS, where the include file does not give them, from the
# first lines of --help: "PROGRAM: what it is" (help2man itself would say
# "manual page for PROGRAM") and "Usage: ARGS" (CLI11 leaves the program's
# name out, where help2man looks for it). The first line then leaves
# DESCRIPTION, where help2man puts it too.
file(READ ${INCLUDE} include_text)
set(name_options "")
set(summary "")
help_lines(lines)
string(REGEX MATCH "^[^;]*" first "${lines}")
if(NOT include_text MATCHES "(^|\n)\\[NAME\\]" AND first MATCHES "^${name}: (.+)$")
  roff_text(summary "${CMAKE_MATCH_1}")
  set(name_options --name=${summary})
  roff_text(summary "${first}")
endif()
if(NOT include_text MATCHES "(^|\n)\\[SYNOPSIS\\]")
  foreach(line IN LISTS lines)
    if(line MATCHES "^Usage: (.*)$")
      set(usage "${CMAKE_MATCH_1}")
      if(NOT usage MATCHES "^${name}( |$)")
        roff_text(usage "${usage}")
        string(REGEX REPLACE "([A-Z][A-Z_]+)" "\\\\fI\\1\\\\fR" usage "${usage}")
        file(WRITE ${OUTPUT}.synopsis.h2m "[SYNOPSIS]\n.B ${name}\n${usage}\n")
        list(APPEND includes --include=${OUTPUT}.synopsis.h2m)
      endif()
      break()
    endif()
  endforeach()
endif()

# The release alone for the page's footer (the commit would not fit there).
execute_process(COMMAND ${PROGRAM} --version OUTPUT_VARIABLE version RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT version MATCHES "^[^ ]+ ([0-9][^ \n]*)")
  message(FATAL_ERROR "${PROGRAM} --version failed or said no version: ${version}")
endif()
set(version ${CMAKE_MATCH_1})

execute_process(
  COMMAND ${HELP2MAN} --no-info --section=${SECTION} --version-string=${version} ${includes}
          ${name_options} --manual=gpuckpt --output=${OUTPUT}.tmp ${PROGRAM}
  RESULT_VARIABLE rc)
file(REMOVE ${OUTPUT}.commands.h2m ${OUTPUT}.synopsis.h2m)
if(NOT rc EQUAL 0)
  file(REMOVE ${OUTPUT}.tmp)
  message(FATAL_ERROR "help2man failed on ${PROGRAM}")
endif()
file(READ ${OUTPUT}.tmp page)
if(summary)
  string(REPLACE "\n.PP\n${summary}\n" "\n" page "${page}")
  string(REPLACE "\n${summary}\n" "\n" page "${page}")
endif()
string(REGEX REPLACE "[0-9]+ MiB: a quarter of this machine's memory"
                     "a quarter of the machine's memory" page "${page}")
file(WRITE ${OUTPUT}.tmp "${page}")
file(RENAME ${OUTPUT}.tmp ${OUTPUT})
