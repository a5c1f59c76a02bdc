# smclo-pc.cmake - writes smclo.pc at install time (install(SCRIPT) in
# CMakeLists.txt), for the prefix being installed to: `cmake --install
# --prefix P` (what `make install PREFIX=P` runs) changes the prefix after
# configuration, so a file written at configure time could name the wrong one.
# The SMCLO_PC_* variables are set by the install(CODE) just before.
foreach(d LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${SMCLO_PC_${d}}")
    set(PC_${d} "${SMCLO_PC_${d}}")
  else()
    set(PC_${d} "\${prefix}/${SMCLO_PC_${d}}")
  endif()
endforeach()
set(PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
set(PC_VERSION "${SMCLO_PC_VERSION}")
configure_file("${SMCLO_PC_IN}" "${SMCLO_PC_OUT}" @ONLY)
