#pragma once
// FileSizeLimit: makes this process's writes past a size fail, to test what a writer does when the
// disk is full.

#include <catch2/catch.hpp>

#include <sys/resource.h>

#include <csignal>

namespace coltrain::testing {

// Limits the size of files this process may write (RLIMIT_FSIZE) until destroyed, and ignores
// SIGXFSZ so that going past it is a failing write(), not a killed process. Works as root too,
// unlike a read-only directory.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved_) == 0);
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit limited = saved_;
    limited.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &limited) == 0);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_handler_);
  }

 private:
  rlimit saved_{};
  void (*previous_handler_)(int) = nullptr;
};

}  // namespace coltrain::testing
