# Fails when a source includes, directly or not, a header it should not: what a file that includes
# coltrain pays for is every header it parses, so the cheap paths (separate compilation's
# declarations, the collectives without training) are checked, not assumed.
#
#   cmake -DCOMPILER="g++|-std=c++20|-I..." -DSOURCE=file.cpp -DFORBIDDEN="regex|regex" -P ...
#
# COMPILER is the command and its flags, '|'-separated (add_test would split a ';'-list).
# FORBIDDEN is a '|'-separated list of regular expressions (so none of them may use '|') matched
# against each path the compiler's -H lists; a match names the header and the chain of headers
# that brought it in.
foreach(variable COMPILER SOURCE FORBIDDEN)
  if(NOT DEFINED ${variable})
    message(FATAL_ERROR "CheckIncludedHeaders: ${variable} is not set")
  endif()
endforeach()

string(REPLACE "|" ";" command "${COMPILER}")
execute_process(COMMAND ${command} -H -fsyntax-only "${SOURCE}"
                RESULT_VARIABLE status OUTPUT_QUIET ERROR_VARIABLE listing)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "CheckIncludedHeaders: ${SOURCE} does not compile:\n${listing}")
endif()

string(REPLACE "|" ";" patterns "${FORBIDDEN}")
string(REPLACE "\n" ";" lines "${listing}")
set(chain "")
set(failures "")
foreach(line IN LISTS lines)
  # -H prints one dot per level of nesting, then the path.
  if(NOT line MATCHES "^(\\.+) (.+)$")
    continue()
  endif()
  string(LENGTH "${CMAKE_MATCH_1}" depth)
  set(path "${CMAKE_MATCH_2}")
  list(LENGTH chain known)
  while(known GREATER_EQUAL depth)
    list(REMOVE_AT chain -1)
    list(LENGTH chain known)
  endwhile()
  list(APPEND chain "${path}")
  foreach(pattern IN LISTS patterns)
    if(path MATCHES "${pattern}")
      set(via "${chain}")
      list(REVERSE via)
      string(REPLACE ";" "\n    included by " via "${via}")
      string(APPEND failures "  '${pattern}': ${via}\n")
    endif()
  endforeach()
endforeach()
if(failures)
  message(FATAL_ERROR "${SOURCE} includes headers it should not:\n${failures}")
endif()
message(STATUS "${SOURCE}: none of ${FORBIDDEN}")
