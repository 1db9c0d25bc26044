# test_install: `cmake --install` of the build tree into a fresh prefix, then two
# out-of-tree consumers built against that prefix only (one with pkg-config flags, one
# with find_package(qsakv) and qsakv::qsakv), run; the installed tool runs through its
# RPATH. Arguments: -DBUILD_DIR -DSRC_DIR -DWORK_DIR -DCC -DCXX -DGENERATOR.
cmake_minimum_required(VERSION 3.25)
set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "$ ${ARGN}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "test_install: failed (${rc}): ${ARGN}")
  endif()
  set(run_out "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# What must be there, the SONAME chain included.
include(GNUInstallDirs)
set(lib ${prefix}/${CMAKE_INSTALL_LIBDIR})
file(GLOB_RECURSE pcs ${prefix}/*/qsakv.pc)
list(LENGTH pcs n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "test_install: expected one qsakv.pc under ${prefix}, found: ${pcs}")
endif()
get_filename_component(pcdir ${pcs} DIRECTORY)
get_filename_component(lib ${pcdir} DIRECTORY)
foreach(f include/qsakv.h include/qsakv_version.h include/qsakv.hpp bin/qsakv)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "test_install: ${prefix}/${f} was not installed")
  endif()
endforeach()
file(GLOB real ${lib}/libqsakv.so.*.*.*)
if(NOT real OR NOT IS_SYMLINK ${lib}/libqsakv.so OR NOT EXISTS ${lib}/libqsakv.so.0
   OR NOT IS_SYMLINK ${lib}/libqsakv.so.0)
  message(FATAL_ERROR "test_install: libqsakv.so -> libqsakv.so.0 -> libqsakv.so.X.Y.Z missing in ${lib}")
endif()
file(GLOB_RECURSE cfgs ${prefix}/*/qsakvConfig.cmake)
if(NOT cfgs)
  message(FATAL_ERROR "test_install: no qsakvConfig.cmake under ${prefix}")
endif()

# 1. pkg-config consumer (C), with the installed tree's flags only.
find_program(PKG_CONFIG pkg-config)
if(NOT PKG_CONFIG)
  message(FATAL_ERROR "test_install: pkg-config not found (tools/install-deps.sh installs it)")
endif()
set(ENV{PKG_CONFIG_PATH} ${pcdir})
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs qsakv OUTPUT_VARIABLE flags
                RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
execute_process(COMMAND ${PKG_CONFIG} --modversion qsakv OUTPUT_VARIABLE pcver
                OUTPUT_STRIP_TRAILING_WHITESPACE)
execute_process(COMMAND ${PKG_CONFIG} --variable=libdir qsakv OUTPUT_VARIABLE pclib
                OUTPUT_STRIP_TRAILING_WHITESPACE)
message(STATUS "pkg-config qsakv: ${flags} (version ${pcver}, libdir ${pclib})")
if(NOT rc EQUAL 0 OR NOT flags MATCHES "-lqsakv")
  message(FATAL_ERROR "test_install: pkg-config --cflags --libs qsakv failed: ${flags}")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${CC} -std=c99 -o ${WORK_DIR}/consumer_pc ${SRC_DIR}/consumer/consumer.c ${flags}
    -Wl,-rpath,${pclib})
run(${WORK_DIR}/consumer_pc)
if(NOT run_out MATCHES "consumer ok: libqsakv ${pcver}")
  message(FATAL_ERROR "test_install: the pkg-config consumer printed: ${run_out}")
endif()

# 2. find_package consumer (C and C++ through qsakv::qsakv).
run(${CMAKE_COMMAND} -S ${SRC_DIR}/consumer -B ${WORK_DIR}/consumer-build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${CC} -DCMAKE_CXX_COMPILER=${CXX})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build)
run(${WORK_DIR}/consumer-build/consumer_cmake_c)
run(${WORK_DIR}/consumer-build/consumer_cmake_cpp)
if(NOT run_out MATCHES "consumer ok")
  message(FATAL_ERROR "test_install: the find_package consumer printed: ${run_out}")
endif()

# 3. The installed tool finds the installed library through its RPATH.
unset(ENV{LD_LIBRARY_PATH})
run(${prefix}/bin/qsakv --help)
message(STATUS "test_install: PASSED (prefix ${prefix})")
