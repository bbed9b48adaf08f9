# Turns a manual written in markdown into a help2man include file (cmake -P;
# see man/CMakeLists.txt):
#
#   cmake -DGO_MD2MAN=... -DMANUAL=docs/gpuckptfs.md
#         -DOUTPUT=build/man/gpuckptfs.h2m -P md2man.cmake
#
# go-md2man renders the manual as roff; here its first paragraph (which says
# what the page is) is left out, the rest of the text before the first `##`
# becomes [DESCRIPTION] (help2man puts --help's own text after it), and each
# `##` heading a section of its own ([THE TREE], [FILES], ...: help2man
# writes the names in capitals; `###` headings stay subsections). What
# go-md2man writes is adjusted for a man page:
#  - links into the source tree keep their text and lose their target;
#  - hyphens become \- (options and paths copy as typed), code is bold;
#  - lines of example text that start with '.' or ''' are kept as text, and
#    lines that start with '[' or '/' are kept from help2man's include
#    syntax;
#  - blank lines between paragraphs go (roff spaces them itself);
#  - from DESCRIPTION on, the page is neither hyphenated nor justified.
# A markdown table stops the build: go-md2man 2.0.2 neither wraps a table's
# cells nor keeps a long cell that is not the last in its row, so tables are
# written as lists. So does anything go-md2man warns about.

cmake_minimum_required(VERSION 3.25)

# The manual's roff as a list of lines (text_lines.cmake), the stand-in
# characters put back at the end.
include(${CMAKE_CURRENT_LIST_DIR}/text_lines.cmake)
string(ASCII 4 minus)
set(lb "${open_bracket}")
set(rb "${close_bracket}")

execute_process(
  COMMAND ${GO_MD2MAN} -in ${MANUAL} -out ${OUTPUT}.roff
  RESULT_VARIABLE rc ERROR_VARIABLE errors)
if(NOT rc EQUAL 0 OR errors)
  file(REMOVE ${OUTPUT}.roff)
  message(FATAL_ERROR "go-md2man failed on ${MANUAL}: ${errors}")
endif()
file(READ ${OUTPUT}.roff roff)
file(REMOVE ${OUTPUT}.roff)
text_to_lines(lines "${roff}")

# The requests go-md2man writes; any other line that starts with '.' is text.
set(requests "^\\.(nh|TH|SH|SS|PP|RS|RE|nf|fi|IP|TP|br|sp|TS|TE)( |$)")

set(out "")             # the include file's lines
set(section "")         # "" before the first `##`, then its title
set(paragraphs 0)       # .PP seen before the first `##`
set(literal OFF)        # inside .nf ... .fi
foreach(line IN LISTS lines)
  if(literal AND NOT line STREQUAL ".fi")
    if(line MATCHES "^[.'${lb}/]")
      set(line "\\&${line}")
    endif()
  elseif(line MATCHES "^\\.TS")
    message(FATAL_ERROR "${MANUAL} has a table, which the man page cannot show well "
                        "(go-md2man neither wraps nor keeps its long cells): write it as a list")
  elseif(line MATCHES "^\\.(nh|TH)( |$)" OR line STREQUAL "")
    continue()
  elseif(line MATCHES "^\\.SH (.*)$")
    set(section "${CMAKE_MATCH_1}")
    string(TOUPPER "${section}" title)
    list(APPEND out "${lb}${title}${rb}")
    continue()
  elseif(line MATCHES "^'" OR (line MATCHES "^\\." AND NOT line MATCHES "${requests}"))
    set(line "\\&${line}")
  elseif(line MATCHES "^[${lb}/]")
    set(line "\\&${line}")
  endif()

  if(section STREQUAL "")
    # The first paragraph says what the page is: not in the page itself.
    if(line STREQUAL ".PP")
      math(EXPR paragraphs "${paragraphs} + 1")
      if(paragraphs EQUAL 2)
        # Neither hyphenated (as go-md2man asks) nor justified, from here to
        # the end: the text is full of long names, paths and options.
        list(APPEND out "${lb}DESCRIPTION${rb}" ".nh" ".ad l")
        continue()
      endif()
    endif()
    if(paragraphs LESS 2)
      continue()
    endif()
  endif()

  if(line STREQUAL ".nf")
    set(literal ON)
  elseif(line STREQUAL ".fi")
    set(literal OFF)
  endif()

  if(NOT line MATCHES "${requests}")
    # Code in bold alone (go-md2man adds \fC, a constant-width font, which
    # is no font on a terminal), and every hyphen a minus sign, but once.
    string(REPLACE "\\fB\\fC" "\\fB" line "${line}")
    string(REPLACE "\\-" "${minus}" line "${line}")
    string(REPLACE "-" "${minus}" line "${line}")
    string(REPLACE "${minus}" "\\-" line "${line}")
  endif()
  # A link into the source tree: go-md2man writes its target after its
  # text, on a line of its own; what follows it joins the text again.
  if(line MATCHES "^\\\\${lb}la${rb}([^${rb}]*)\\\\${lb}ra${rb}(.*)$")
    set(target "${CMAKE_MATCH_1}")
    set(rest "${CMAKE_MATCH_2}")
    if(NOT target MATCHES "^(https?|mailto):")
      list(POP_BACK out previous)
      list(APPEND out "${previous}${rest}")
      continue()
    endif()
  endif()
  list(APPEND out "${line}")
endforeach()
if(section STREQUAL "")
  message(FATAL_ERROR "${MANUAL} has no `##` section")
endif()

string(REPLACE ";" "\n" text "${out}")
restore_characters(text "${text}")
get_filename_component(manual_name ${MANUAL} NAME)
file(WRITE ${OUTPUT}.tmp
     "Made from ${manual_name} by man/md2man.cmake: edit the manual, not this file.\n\n${text}\n")
file(RENAME ${OUTPUT}.tmp ${OUTPUT})
