# The engine's layers, declared once: each folder of engine/ and the folders its files may include
# (docs/architecture.md's table; tests/layering.py holds the table, this list and the includes to
# each other). Included by engine/CMakeLists.txt at configure time and run again by every build
# (target check_layers): a file that includes a folder its own does not list fails the build,
# naming the file, the include and what its folder may include.
#   cmake -DPTOOL_ENGINE_DIR=engine -P cmake/check_layers.cmake
if(CMAKE_SCRIPT_MODE_FILE)  # run with -P: no project set the policies (IN_LIST)
  cmake_minimum_required(VERSION 3.22)
endif()
set(ptool_layers core backend comm model parallel import train plan verify)
set(ptool_layer_core "")
set(ptool_layer_backend core)
set(ptool_layer_comm core backend)
set(ptool_layer_model core backend comm)
set(ptool_layer_parallel core backend comm model)
set(ptool_layer_import core parallel)
set(ptool_layer_train core backend comm model parallel)
set(ptool_layer_plan core backend comm model parallel train)
set(ptool_layer_verify core backend comm model parallel train)

set(ptool_layer_errors "")
foreach(layer IN LISTS ptool_layers)
  file(GLOB_RECURSE layer_files "${PTOOL_ENGINE_DIR}/${layer}/*.h" "${PTOOL_ENGINE_DIR}/${layer}/*.cpp"
       "${PTOOL_ENGINE_DIR}/${layer}/*.cu" "${PTOOL_ENGINE_DIR}/${layer}/*.cuh")
  foreach(f IN LISTS layer_files)
    file(STRINGS "${f}" includes REGEX "^[ \t]*#[ \t]*include[ \t]+\"[a-z_]+/")
    foreach(inc IN LISTS includes)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([a-z_]+)/.*" "\\1" used "${inc}")
      if(NOT used STREQUAL layer AND used IN_LIST ptool_layers AND NOT used IN_LIST ptool_layer_${layer})
        string(REPLACE ";" ", " allowed "${ptool_layer_${layer}}")
        if(allowed STREQUAL "")
          set(allowed "no other folder")
        endif()
        string(APPEND ptool_layer_errors "\n  ${f}: ${inc}: ${layer}/ may include ${allowed} (cmake/check_layers.cmake)")
      endif()
    endforeach()
  endforeach()
endforeach()
if(ptool_layer_errors)
  message(FATAL_ERROR "an include crosses the engine's layers:${ptool_layer_errors}")
endif()
