# Writes gpuckpt/version.h: the release and the git commit the build comes
# from. Run at every build (cmake -P, from the gpuckpt_version_header target
# in CMakeLists.txt), so that a rebuild after a commit or an edit says so
# without re-running cmake; the header is rewritten only when its content
# changes, so nothing recompiles when neither did.
#
#   cmake -DSOURCE_DIR=DIR -DOUTPUT=FILE -DVERSION=X.Y.Z -P GpuckptVersion.cmake
#
# GPUCKPT_COMMIT is git's short hash of HEAD, with "-dirty" when a tracked
# file differs from it, or "unknown" where the source has no git (a
# tarball) or git is not installed: such a build says so, never fails.
cmake_minimum_required(VERSION 3.25)
foreach(var SOURCE_DIR OUTPUT VERSION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "GpuckptVersion.cmake: -D${var}=... is required")
  endif()
endforeach()

set(commit "unknown")
set(commit_words "commit unknown: not built from a git checkout")
find_program(GIT_EXECUTABLE git)
if(GIT_EXECUTABLE AND EXISTS "${SOURCE_DIR}/.git")
  # --no-optional-locks: never rewrite the checkout's index (the build may
  # run as root in a user's checkout); safe.directory: a checkout owned by
  # someone else is still read rather than refused.
  set(git ${GIT_EXECUTABLE} --no-optional-locks -c safe.directory=${SOURCE_DIR} -C ${SOURCE_DIR})
  execute_process(COMMAND ${git} rev-parse --short HEAD
                  OUTPUT_VARIABLE hash OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE hash_rc ERROR_QUIET)
  execute_process(COMMAND ${git} status --porcelain --untracked-files=no
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE status_rc ERROR_QUIET)
  if(hash_rc EQUAL 0 AND status_rc EQUAL 0 AND hash MATCHES "^[0-9a-f]+$")
    set(commit "${hash}")
    if(NOT changes STREQUAL "")
      string(APPEND commit "-dirty")
    endif()
    set(commit_words "commit ${commit}")
  endif()
endif()

file(CONFIGURE OUTPUT "${OUTPUT}" @ONLY CONTENT [[
// Generated at build time by cmake/GpuckptVersion.cmake: do not edit.
//
// What the binaries say with --version and snapshots record as
// `written_by` (core/store/FORMAT.md). Include as "gpuckpt/version.h" after
// linking the CMake target gpuckpt_version.
#pragma once

// The release, as in CMakeLists.txt's project(): "0.1.0".
#define GPUCKPT_VERSION "@VERSION@"
// git's short hash of the commit built, "-dirty" appended when tracked
// files differed from it ("9bb0662", "9bb0662-dirty"); "unknown" for a
// build without git (a source tarball).
#define GPUCKPT_COMMIT "@commit@"
// Both, as --version prints them after the program's name:
// "0.1.0 (commit 9bb0662)".
#define GPUCKPT_VERSION_STRING "@VERSION@ (@commit_words@)"
]])
