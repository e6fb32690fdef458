// Forced into every C++ file of the wheel (TSAR_SELF_CONTAINED,
// cmake/TsarDeps.cmake) so that the wheel runs on glibc 2.34 and GCC 11's
// libstdc++ (RHEL 9 and its rebuilds, Amazon Linux 2023): manylinux_2_34
// instead of the manylinux_2_35 that Debian 12's toolchain picks by itself.
//
// Two functions are all that needed the newer libraries; each still has its
// older version in today's libraries, and that is the one bound here:
// - std::condition_variable::wait(unique_lock&): GCC 12 gave it version
//   GLIBCXX_3.4.30 when it stopped being noexcept; GLIBCXX_3.4.11 is the
//   noexcept one (they differ only when a thread is cancelled, which tsar
//   never does).
// - hypot: glibc 2.35 gave it a version without the SVID error handling
//   (errno on overflow); GLIBC_2.2.5 returns the same values.
// scripts/build-wheel.sh lets auditwheel pick the tag from the symbols that
// remain, and scripts/check_wheel_libs.py prints it, so a new symbol that
// needs a newer library shows there as a higher tag.
#ifndef TSAR_CMAKE_SYMBOL_VERSIONS_H_
#define TSAR_CMAKE_SYMBOL_VERSIONS_H_

__asm__(".symver _ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE,"
        "_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE@GLIBCXX_3.4.11");
__asm__(".symver hypot,hypot@GLIBC_2.2.5");

#endif  // TSAR_CMAKE_SYMBOL_VERSIONS_H_
