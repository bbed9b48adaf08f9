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
