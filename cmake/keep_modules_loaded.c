/* Linked into every executable of an AddressSanitizer build (cmake/KeepModulesLoaded.cmake).
 *
 * Open MPI dlopen()s its components, and the libraries they bring (PMIx, PSM2), and
 * dlclose()s them in MPI_Finalize. The allocations they make once per process and never
 * free are reported by LeakSanitizer at exit, and .ci/lsan.supp suppresses them by the
 * library that made them. With frame-pointer unwinding (fast_unwind_on_malloc=1, four
 * times faster than DWARF unwinding of every malloc) a report holds only the allocating
 * frame, and a library closed since is an "<unknown module>" that no suppression can
 * name. Defining dlclose here, exported from the executable, interposes it for every
 * library: nothing is unmapped, and each report names its library. Test builds only. */
int dlclose(void* handle) {
  (void)handle;
  return 0;
}
