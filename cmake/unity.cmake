# Unity builds in fixed groups (UNITY_BUILD_MODE GROUP). CMake's default batches follow the
# target's source list, so a build tree that compiles a subset or a superset of it (the TSan
# tree's tests, the CUDA tree's engine) would combine files the default build never combines, and
# a name clash between two files' internal helpers would first break there. Here a file's group
# comes from its position in the full list given, whatever the tree compiles: every pair of files
# that shares a compiler run anywhere shares one in the default build too.
# Files with options of their own (the SIMD kernels' ISA flags, -ffp-contract=off) and files not
# listed (CUDA sources, generated ones) compile one at a time.
function(klein_unity_groups target prefix)
  if(NOT KLEIN_UNITY_BUILD)
    return()
  endif()
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)
  set(position 0)
  foreach(file IN LISTS ARGN)
    get_source_file_property(own_options ${file} COMPILE_OPTIONS)
    if(own_options)
      continue()
    endif()
    math(EXPR group "${position} / 8")
    set_source_files_properties(${file} PROPERTIES UNITY_GROUP ${prefix}_${group})
    math(EXPR position "${position} + 1")
  endforeach()
endfunction()
