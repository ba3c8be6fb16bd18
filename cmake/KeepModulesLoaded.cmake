# AddressSanitizer builds: every executable keeps the libraries it dlopen()s mapped to the
# end, so that LeakSanitizer's reports name them (see keep_modules_loaded.c).
add_library(distckpt_keep_modules_loaded OBJECT ${CMAKE_CURRENT_LIST_DIR}/keep_modules_loaded.c)
set_target_properties(distckpt_keep_modules_loaded PROPERTIES POSITION_INDEPENDENT_CODE ON)

# Adds it to each executable defined in DIR and its subdirectories.
function(distckpt_keep_modules_loaded dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "EXECUTABLE")
      target_link_libraries(${target} PRIVATE distckpt_keep_modules_loaded)
      # Exported, so that the dynamic linker binds the libraries' dlclose to it.
      target_link_options(${target} PRIVATE -Wl,--export-dynamic-symbol=dlclose)
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(subdir IN LISTS subdirs)
    distckpt_keep_modules_loaded(${subdir})
  endforeach()
endfunction()
