# A precompiled <torch/torch.h> for the translation units that include
# LibTorch's heavy headers.
#
# Parsing <torch/torch.h> is most of what compiling one of the engine's
# heavy files costs (trainer_step.cc: 58 s from scratch, 22 s with the
# header precompiled; gcc 12, -O2 -g, LibTorch 1.13). But loading the
# precompiled header costs ~16 s by itself (with -g, 700 MB, and its debug
# information goes into every object), so a file that includes only
# LibTorch's light headers (<ATen/core/Tensor.h>, c10's) gets slower with
# it, and a file without LibTorch much slower. So a source uses it only when
# it includes one of the headers in torch-heavy-headers.txt itself (ours include only
# light ones). Measured over build/ (docs/testing.md): 22 files use it, and
# their compile time falls by about a half.
#
# The first target with such a file compiles the header once; every other
# target under the directories given to trainctl_use_torch_pch() reuses it
# (REUSE_FROM); other sources skip it (SKIP_PRECOMPILE_HEADERS). gcc
# takes a precompiled header only when it was made with compatible options;
# otherwise it warns (-Winvalid-pch) and parses the headers as before:
# slower, never wrong. -DTRAINCTL_TORCH_PCH=OFF turns it off; clang builds
# (scripts/thread-safety.sh makes its own) do not use it.
option(TRAINCTL_TORCH_PCH "Precompile <torch/torch.h> for the files that include LibTorch's heavy headers" ON)

# The heavy headers, one a line: also read by scripts/thread-safety.sh.
file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/torch-heavy-headers.txt" _trainctl_heavy_headers)
list(TRANSFORM _trainctl_heavy_headers REPLACE "\\." "\\\\.")
list(JOIN _trainctl_heavy_headers "|" _trainctl_heavy_alternatives)
set(_TRAINCTL_TORCH_HEAVY "#include <(${_trainctl_heavy_alternatives})>")

function(_trainctl_targets_under dir out)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _trainctl_targets_under("${sub}" more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} "${targets}" PARENT_SCOPE)
endfunction()

# trainctl_use_torch_pch(DIR ...): the precompiled header for the heavy
# LibTorch sources of every target under each DIR (relative to the calling
# directory). Call it after those directories were added.
function(trainctl_use_torch_pch)
  if(NOT TRAINCTL_TORCH_PCH OR NOT TRAINCTL_WITH_TORCH OR NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    return()
  endif()
  set(donor "")
  set(files 0)
  foreach(dir IN LISTS ARGN)
    _trainctl_targets_under("${CMAKE_CURRENT_SOURCE_DIR}/${dir}" targets)
    foreach(target IN LISTS targets)
      get_target_property(type ${target} TYPE)
      if(NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|OBJECT_LIBRARY)$")
        continue()
      endif()
      get_target_property(sources ${target} SOURCES)
      get_target_property(source_dir ${target} SOURCE_DIR)
      set(heavy "")
      set(light "")
      foreach(s IN LISTS sources)
        if(NOT s MATCHES "\\.cc$")
          continue()
        endif()
        if(IS_ABSOLUTE "${s}")
          set(path "${s}")
        else()
          set(path "${source_dir}/${s}")
        endif()
        file(STRINGS "${path}" lines REGEX "${_TRAINCTL_TORCH_HEAVY}")
        # Absolute: set_source_files_properties reads relative paths from
        # this (the calling) directory, not the target's.
        if(lines)
          list(APPEND heavy "${path}")
        else()
          list(APPEND light "${path}")
        endif()
      endforeach()
      if(NOT heavy)
        continue()
      endif()
      if(NOT donor)
        set(donor ${target})
        target_precompile_headers(${target} PRIVATE <torch/torch.h>)
      else()
        target_precompile_headers(${target} REUSE_FROM ${donor})
      endif()
      target_compile_options(${target} PRIVATE -Winvalid-pch)
      if(light)
        set_source_files_properties(${light} TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
      endif()
      list(LENGTH heavy n)
      math(EXPR files "${files} + ${n}")
    endforeach()
  endforeach()
  message(STATUS "trainctl: precompiled <torch/torch.h> (made for ${donor}) for ${files} LibTorch files")
endfunction()
