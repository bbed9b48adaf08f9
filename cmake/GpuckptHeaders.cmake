# Which headers of a module other modules may include, enforced by the
# compiler rather than by review.
#
# Code includes a module's header by its path from the source root
# ("core/store/chunk_store.h"), but no target has the source root on its
# include path. Instead gpuckpt_headers() links each declared header into
# a tree of its own in the build directory:
#
#   <build>/headers/<target>/public/core/store/chunk_store.h   -> the source
#   <build>/headers/<target>/internal/core/store/chunk_packs.h -> the source
#
# The public tree is a PUBLIC include directory of the target, so whatever
# links the target (and whatever links that, where the link is PUBLIC) may
# include those headers; the internal tree is PRIVATE, for the module's
# own sources. A header of a module that a target does not link, or an
# internal header of another module, is then "file not found" at compile
# time. The API under include/gpuckpt/ is reachable from every module
# through gpuckpt_base.
#
# Every header under core/, fs/ and tools/ must be declared by exactly one
# target; gpuckpt_check_headers_declared() fails the configure step when
# one is not, so that a new header cannot slip past the rule unnoticed.
# Unit tests are white-box: they see the whole source tree (gpuckpt_testing).

# gpuckpt_headers(<target> [PUBLIC header...] [INTERNAL header...])
# Headers are paths from the source root.
function(gpuckpt_headers target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "PUBLIC;INTERNAL")
  set(root ${PROJECT_BINARY_DIR}/headers/${target})
  file(REMOVE_RECURSE ${root})
  get_target_property(type ${target} TYPE)
  foreach(kind PUBLIC INTERNAL)
    string(TOLOWER ${kind} tree)
    foreach(header IN LISTS arg_${kind})
      if(NOT EXISTS ${PROJECT_SOURCE_DIR}/${header})
        message(FATAL_ERROR "${target}: declared header ${header} does not exist")
      endif()
      get_filename_component(dir ${root}/${tree}/${header} DIRECTORY)
      file(MAKE_DIRECTORY ${dir})
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${header} ${root}/${tree}/${header} SYMBOLIC)
      set_property(GLOBAL APPEND PROPERTY GPUCKPT_DECLARED_HEADERS ${header})
    endforeach()
  endforeach()
  # For gpuckpt_check_hidden(): what the target shows to others.
  set_property(TARGET ${target} PROPERTY GPUCKPT_PUBLIC_HEADERS ${arg_PUBLIC})
  if(type STREQUAL "INTERFACE_LIBRARY")
    if(arg_INTERNAL)
      message(FATAL_ERROR "${target}: a header-only target has no internal headers")
    endif()
    target_include_directories(${target} INTERFACE ${root}/public)
  else()
    if(arg_PUBLIC)
      target_include_directories(${target} PUBLIC ${root}/public)
    endif()
    if(arg_INTERNAL)
      target_include_directories(${target} PRIVATE ${root}/internal)
    endif()
  endif()
endfunction()

function(gpuckpt_check_headers_declared)
  file(GLOB_RECURSE present RELATIVE ${PROJECT_SOURCE_DIR} CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/core/*.h ${PROJECT_SOURCE_DIR}/fs/*.h ${PROJECT_SOURCE_DIR}/tools/*.h)
  get_property(declared GLOBAL PROPERTY GPUCKPT_DECLARED_HEADERS)
  set(seen "")
  foreach(header IN LISTS declared)
    if(header IN_LIST seen)
      message(FATAL_ERROR "${header} is declared by two targets")
    endif()
    list(APPEND seen ${header})
  endforeach()
  foreach(header IN LISTS present)
    if(NOT header IN_LIST declared)
      message(FATAL_ERROR "${header} is not declared: list it under PUBLIC or INTERNAL in the "
                          "gpuckpt_headers() of its module (CMakeLists.txt)")
    endif()
  endforeach()
endfunction()

# A library on the system include path (RocksDB's headers are in
# /usr/include) is reachable from every module however the targets are
# linked, so the trees above cannot keep a module from including it.
# gpuckpt_forbid_includes() does: it fails the configure step, and then the
# build whenever one of the files changes, when a source or header under
# one of DIRS includes a header whose path starts with PREFIX.
#
# gpuckpt_forbid_includes(<name> PREFIX <prefix> DIRS <dir>... BEFORE <target> WHY <text>)
# DIRS are paths from the source root; the check runs before <target>
# (one that every build compiles) and as part of `all`.
function(gpuckpt_forbid_includes name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "PREFIX;BEFORE;WHY" "DIRS")
  set(files "")
  foreach(dir IN LISTS arg_DIRS)
    file(GLOB_RECURSE found CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${dir}/*.h
         ${PROJECT_SOURCE_DIR}/${dir}/*.cc)
    list(APPEND files ${found})
  endforeach()
  _gpuckpt_check_includes("${arg_PREFIX}" "${files}" "${arg_WHY}")
  list(JOIN arg_DIRS ", " dirs)
  set(out ${PROJECT_BINARY_DIR}/forbidden_includes)
  file(WRITE ${out}/${name}.files "${files}")
  add_custom_command(
    OUTPUT ${out}/${name}.checked
    COMMAND ${CMAKE_COMMAND} -DGPUCKPT_FORBIDDEN_PREFIX=${arg_PREFIX}
            -DGPUCKPT_FILES_LIST=${out}/${name}.files "-DGPUCKPT_WHY=${arg_WHY}"
            -P ${CMAKE_CURRENT_FUNCTION_LIST_FILE}
    COMMAND ${CMAKE_COMMAND} -E touch ${out}/${name}.checked
    DEPENDS ${files} ${out}/${name}.files
    COMMENT "Checking that no file under ${dirs} includes <${arg_PREFIX}...>"
    VERBATIM)
  add_custom_target(gpuckpt_no_${name}_includes ALL DEPENDS ${out}/${name}.checked)
  add_dependencies(${arg_BEFORE} gpuckpt_no_${name}_includes)
endfunction()

function(_gpuckpt_check_includes prefix files why)
  foreach(f IN LISTS files)
    file(STRINGS ${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]${prefix}")
    if(lines)
      list(GET lines 0 line)
      string(STRIP "${line}" line)
      message(FATAL_ERROR "${f}: ${line}: ${why}")
    endif()
  endforeach()
endfunction()

# A header may also reach such a library through another header (a public
# header of the store including <rocksdb/db.h> brings RocksDB to whoever
# includes that header), which gpuckpt_forbid_includes(), reading each file
# alone, does not see. gpuckpt_check_hidden() does: as part of every build
# it compiles, for each PUBLIC header of TARGETS (all that other modules may
# include of them), a source that includes that header alone and fails,
# naming it, when one of MARKERS is defined after it: macros that the
# library's own headers define, and nothing else. The compiler follows the
# includes as the modules' own sources do, headers of headers and all,
# where a text search would have to resolve them itself. Declaring the
# library's types (a forward declaration) defines no marker and passes: the
# modules may hold pointers they cannot use.
#
# gpuckpt_check_hidden(<name> TARGETS <target>... MARKERS <macro>...
#                      BEFORE <target>... WHY <text>)
# The check runs before each BEFORE target (those whose sources include the
# headers) and as part of `all`. WHY follows the header's name in the error.
function(gpuckpt_check_hidden name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "WHY" "TARGETS;MARKERS;BEFORE")
  list(JOIN arg_MARKERS ") || defined(" markers)
  set(dir ${PROJECT_BINARY_DIR}/hidden_includes/${name})
  set(sources "")
  foreach(target IN LISTS arg_TARGETS)
    get_target_property(headers ${target} GPUCKPT_PUBLIC_HEADERS)
    foreach(header IN LISTS headers)
      string(REGEX REPLACE "[/.]" "_" source ${header})
      # Written only when it changes, so that a configure recompiles nothing.
      file(CONFIGURE OUTPUT ${dir}/${source}.cc @ONLY CONTENT
           "// Generated by gpuckpt_check_hidden(${name}), cmake/GpuckptHeaders.cmake.
#include \"${header}\"
#if defined(${markers})
#error \"${header}: ${arg_WHY}\"
#endif
")
      list(APPEND sources ${dir}/${source}.cc)
    endforeach()
  endforeach()
  add_library(gpuckpt_no_${name}_in_headers OBJECT ${sources})
  target_link_libraries(gpuckpt_no_${name}_in_headers PRIVATE ${arg_TARGETS})
  foreach(target IN LISTS arg_BEFORE)
    add_dependencies(${target} gpuckpt_no_${name}_in_headers)
  endforeach()
endfunction()

# Run as a script (cmake -P) by the build step of gpuckpt_forbid_includes().
if(CMAKE_SCRIPT_MODE_FILE AND DEFINED GPUCKPT_FILES_LIST)
  file(READ ${GPUCKPT_FILES_LIST} files)
  _gpuckpt_check_includes("${GPUCKPT_FORBIDDEN_PREFIX}" "${files}" "${GPUCKPT_WHY}")
endif()
