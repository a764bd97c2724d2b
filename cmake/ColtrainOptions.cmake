# Tri-state options for optional backends: AUTO (use when found), ON (required), OFF (never).

# Declares the cache option `name` and sets `<name>_MODE` (AUTO, ON or OFF) in the caller's scope, so
# that the usual CMake spellings of true and false (YES, 1, FALSE...) are accepted too.
function(coltrain_tristate_option name doc)
  set(${name} AUTO CACHE STRING "${doc} (AUTO: use when found; ON: required; OFF: never)")
  set_property(CACHE ${name} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "${${name}}" value)
  if(value STREQUAL "AUTO")
    set(mode AUTO)
  elseif(value MATCHES "^(ON|YES|TRUE|Y|1)$")
    set(mode ON)
  elseif(value MATCHES "^(OFF|NO|FALSE|N|0)$")
    set(mode OFF)
  else()
    message(FATAL_ERROR "${name} must be AUTO, ON or OFF, not '${${name}}'")
  endif()
  set(${name}_MODE ${mode} PARENT_SCOPE)
endfunction()

# Turns a tri-state option and whether its dependency was found into the final answer `<name>_ENABLED`
# (TRUE/FALSE in the caller's scope). ON without the dependency stops configuration with `hint`.
function(coltrain_resolve_option name found hint)
  if(${name}_MODE STREQUAL "OFF")
    set(enabled FALSE)
  elseif(found)
    set(enabled TRUE)
  elseif(${name}_MODE STREQUAL "ON")
    message(FATAL_ERROR "${name}=ON but it was not found. ${hint}")
  else()
    set(enabled FALSE)
  endif()
  set(${name}_ENABLED ${enabled} PARENT_SCOPE)
endfunction()
