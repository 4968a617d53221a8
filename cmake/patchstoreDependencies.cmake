# LMDB and xxHash as the imported targets PkgConfig::LMDB and
# PkgConfig::XXHASH: through pkg-config when it knows them, else by header
# and library name (a machine without pkg-config, or packages unpacked under
# CMAKE_PREFIX_PATH, as on GPU nodes without network). Used by the build and
# by the installed package's config.
macro(patchstore_find_store_dependencies)
  find_package(PkgConfig QUIET)
  foreach(_ps_dep IN ITEMS "LMDB|lmdb|lmdb.h|lmdb|liblmdb-dev" "XXHASH|libxxhash|xxhash.h|xxhash|libxxhash-dev")
    string(REPLACE "|" ";" _ps_dep "${_ps_dep}")
    list(GET _ps_dep 0 _ps_var)
    list(GET _ps_dep 1 _ps_pc)
    list(GET _ps_dep 2 _ps_header)
    list(GET _ps_dep 3 _ps_lib)
    list(GET _ps_dep 4 _ps_package)
    if(NOT TARGET PkgConfig::${_ps_var})
      if(PKG_CONFIG_FOUND)
        pkg_check_modules(${_ps_var} QUIET IMPORTED_TARGET ${_ps_pc})
      endif()
      if(NOT TARGET PkgConfig::${_ps_var})
        find_path(PATCHSTORE_${_ps_var}_INCLUDE_DIR ${_ps_header})
        find_library(PATCHSTORE_${_ps_var}_LIBRARY ${_ps_lib})
        if(NOT PATCHSTORE_${_ps_var}_INCLUDE_DIR OR NOT PATCHSTORE_${_ps_var}_LIBRARY)
          message(FATAL_ERROR "patchstore needs ${_ps_header} and lib${_ps_lib} (Debian: ${_ps_package}); "
                              "neither pkg-config nor CMAKE_PREFIX_PATH found them")
        endif()
        add_library(PkgConfig::${_ps_var} INTERFACE IMPORTED)
        set_target_properties(PkgConfig::${_ps_var} PROPERTIES
          INTERFACE_INCLUDE_DIRECTORIES "${PATCHSTORE_${_ps_var}_INCLUDE_DIR}"
          INTERFACE_LINK_LIBRARIES "${PATCHSTORE_${_ps_var}_LIBRARY}")
      endif()
    endif()
  endforeach()
endmacro()
