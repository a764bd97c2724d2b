#pragma once
// The flight recorder: every communicator keeps its last N collective calls (number, collective,
// algorithm, dtype, count, op, root, state, start and end times, the error that ended one), and
// writes them as JSON when a call fails (an error, a timeout, a mismatch, a lost peer), for a
// job that hangs on SIGUSR1, and on SIGTERM (what mpiexec, srun and torchrun send the other ranks
// when one fails) before the process ends as SIGTERM would end it. scripts/diagnose merges the
// ranks' files into one verdict: which rank is behind, which wrote nothing, where the calls first
// differ.
//
//   COLTRAIN_TRACE_DIR=runs/flight mpiexec -n 4 ./trainer     # a rank fails or hangs...
//   kill -USR1 <pids>                                          # (hung: ask every rank to write)
//   scripts/diagnose runs/flight
//
// Files: DIR/flight_rank<R>.json, replaced atomically at each dump. COLTRAIN_TRACE_RECORDS sets N
// (default 1000). Recording costs a mutex and a clock read per call; writing happens only on
// failure or on request. The SIGUSR1 and SIGTERM handlers are installed by the first communicator
// that has a trace directory, each only where the program has none of its own; a thread of ours
// does the writing, since a signal handler may not.

#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/atomic_file.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/env_count.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json_string.hpp>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace coltrain::comm {

struct CollectiveRecord {
  enum class State { kStarted, kDone, kFailed };
  MessageHeader call;
  State state = State::kStarted;
  double start_seconds = 0;  // Unix time, so that ranks on different hosts line up
  double end_seconds = 0;    // 0 while started
  std::string error;         // what ended a failed call
};

constexpr std::string_view name_of(CollectiveRecord::State state) {
  switch (state) {
    case CollectiveRecord::State::kStarted:
      return "started";
    case CollectiveRecord::State::kDone:
      return "done";
    case CollectiveRecord::State::kFailed:
      return "failed";
  }
  return "?";
}

namespace detail {

inline double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace detail

class FlightRecorder {
 public:
  explicit FlightRecorder(std::size_t capacity = coltrain::detail::count_from_env(
                              "COLTRAIN_TRACE_RECORDS", 1000, 10'000'000, "records"))
      : capacity_(std::max<std::size_t>(capacity, 1)) {
    records_.reserve(std::min<std::size_t>(capacity_, 4096));
  }
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;
  ~FlightRecorder() { set_trace_dir({}); }

  // Who is recording, for the file's header.
  void set_identity(int rank, int size, std::string_view backend) {
    const std::lock_guard lock(mutex_);
    rank_ = rank;
    size_ = size;
    backend_ = backend;
  }
  // Where dumps go; empty: nowhere (failures are still recorded). A recorder with a directory
  // answers SIGUSR1.
  void set_trace_dir(std::filesystem::path dir);
  std::filesystem::path trace_dir() const {
    const std::lock_guard lock(mutex_);
    return dir_;
  }

  void started(const MessageHeader& call) {
    CollectiveRecord record;
    record.call = call;
    record.start_seconds = detail::unix_seconds();
    const std::lock_guard lock(mutex_);
    if (records_.size() < capacity_) {
      records_.push_back(std::move(record));
    } else {
      records_[next_] = std::move(record);
      next_ = (next_ + 1) % capacity_;
    }
  }
  void done(std::uint64_t sequence) { finish(sequence, CollectiveRecord::State::kDone, {}); }
  void failed(std::uint64_t sequence, std::string_view error) {
    finish(sequence, CollectiveRecord::State::kFailed, error);
  }

  // Oldest first.
  std::vector<CollectiveRecord> records() const {
    const std::lock_guard lock(mutex_);
    std::vector<CollectiveRecord> ordered(records_.begin() + static_cast<std::ptrdiff_t>(next_),
                                          records_.end());
    ordered.insert(ordered.end(), records_.begin(),
                   records_.begin() + static_cast<std::ptrdiff_t>(next_));
    return ordered;
  }

  std::string to_json(std::string_view reason) const {
    const std::vector<CollectiveRecord> all = records();
    std::string out = "{\"format\": \"coltrain flight recorder 1\", \"rank\": ";
    {
      const std::lock_guard lock(mutex_);
      out +=
          std::to_string(rank_) + ", \"world_size\": " + std::to_string(size_) + ", \"backend\": ";
      coltrain::detail::append_json_string(out, backend_);
    }
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    out += ", \"host\": ";
    coltrain::detail::append_json_string(out, host);
    out += ", \"pid\": " + std::to_string(getpid()) + ", \"reason\": ";
    coltrain::detail::append_json_string(out, reason);
    out += ", \"written\": " + seconds_text(detail::unix_seconds()) + ", \"records\": [";
    for (std::size_t i = 0; i < all.size(); ++i) {
      const CollectiveRecord& r = all[i];
      out += i == 0 ? "\n  " : ",\n  ";
      out += "{\"sequence\": " + std::to_string(r.call.sequence) + ", \"collective\": \"" +
             std::string(name_of(r.call.collective)) + "\", \"algorithm\": \"" +
             std::string(name_of(r.call.algorithm)) + "\", \"dtype\": \"" +
             std::string(name_of(r.call.dtype)) + "\", \"count\": " + std::to_string(r.call.count) +
             ", \"op\": \"" + std::string(name_of(r.call.op)) +
             "\", \"root\": " + std::to_string(r.call.root) + ", \"state\": \"" +
             std::string(name_of(r.state)) + "\", \"start\": " + seconds_text(r.start_seconds) +
             ", \"end\": " + (r.end_seconds > 0 ? seconds_text(r.end_seconds) : "null");
      if (!r.error.empty()) {
        out += ", \"error\": ";
        coltrain::detail::append_json_string(out, r.error);
      }
      out += '}';
    }
    out += all.empty() ? "]}\n" : "\n]}\n";
    return out;
  }

  // Writes DIR/flight_rank<R>.json atomically (nothing without a directory); returns the file, or
  // an empty path. Never throws: it runs while an error is on its way out.
  std::filesystem::path dump(std::string_view reason) const noexcept {
    try {
      const std::filesystem::path dir = trace_dir();
      if (dir.empty()) return {};
      std::filesystem::create_directories(dir);
      int rank = 0;
      {
        const std::lock_guard lock(mutex_);
        rank = rank_;
      }
      const std::filesystem::path file = dir / ("flight_rank" + std::to_string(rank) + ".json");
      write_file_atomically(file, to_json(reason));
      return file;
    } catch (...) {
      return {};
    }
  }

 private:
  static std::string seconds_text(double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%.6f", seconds);
    return text;
  }

  void finish(std::uint64_t sequence, CollectiveRecord::State state, std::string_view error) {
    const double now = detail::unix_seconds();
    const std::lock_guard lock(mutex_);
    // The call in flight is the newest record, unless a nested one (a staged chunk) came after.
    for (std::size_t k = 0; k < records_.size(); ++k) {
      const std::size_t i = (next_ + records_.size() - 1 - k) % records_.size();
      if (records_[i].call.sequence == sequence &&
          records_[i].state == CollectiveRecord::State::kStarted) {
        records_[i].state = state;
        records_[i].end_seconds = now;
        records_[i].error = error;
        return;
      }
    }
  }

  const std::size_t capacity_;
  mutable std::mutex mutex_;
  std::vector<CollectiveRecord> records_;
  std::size_t next_ = 0;  // the oldest record once the buffer is full
  int rank_ = 0;
  int size_ = 1;
  std::string backend_;
  std::filesystem::path dir_;
};

namespace detail {

// SIGUSR1 or SIGTERM -> a pipe (the signal's number as one byte) -> a thread of ours that asks
// every registered recorder to dump; after SIGTERM it restores the default action and raises the
// signal again, so that the process ends as it would have.
class FlightRecorderSignal {
 public:
  static FlightRecorderSignal& instance() {
    static FlightRecorderSignal* signal = new FlightRecorderSignal;  // lives until exit
    return *signal;
  }

  void add(const FlightRecorder* recorder) {
    const std::lock_guard lock(mutex_);
    install();
    if (std::find(recorders_.begin(), recorders_.end(), recorder) == recorders_.end())
      recorders_.push_back(recorder);
  }
  void remove(const FlightRecorder* recorder) {
    const std::lock_guard lock(mutex_);
    std::erase(recorders_, recorder);
  }
  // Whether SIGUSR1 reaches the recorders (false where the program had a handler of its own).
  bool answers_sigusr1() const {
    const std::lock_guard lock(mutex_);
    return answers_sigusr1_;
  }
  // Whether SIGTERM makes them write before the process ends.
  bool answers_sigterm() const {
    const std::lock_guard lock(mutex_);
    return answers_sigterm_;
  }

 private:
  static int& write_end() {
    static int fd = -1;
    return fd;
  }
  static void on_signal(int number) {
    const int saved = errno;
    const char byte = static_cast<char>(number);
    [[maybe_unused]] const ssize_t written = ::write(write_end(), &byte, 1);
    errno = saved;
  }

  void install() {
    if (tried_) return;
    tried_ = true;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return;
    write_end() = fds[1];
    answers_sigusr1_ = take_over(SIGUSR1);
    answers_sigterm_ = take_over(SIGTERM);
    std::thread([this, read_end = fds[0]] { serve(read_end); }).detach();
  }

  // Installs on_signal for `number` if the program left it at the default action.
  static bool take_over(int number) {
    struct sigaction previous {};
    if (sigaction(number, nullptr, &previous) != 0 || previous.sa_handler != SIG_DFL) return false;
    struct sigaction action {};
    action.sa_handler = &FlightRecorderSignal::on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    return sigaction(number, &action, nullptr) == 0;
  }

  void serve(int read_end) {
    for (;;) {
      pollfd p{read_end, POLLIN, 0};
      if (poll(&p, 1, -1) < 0 && errno != EINTR) return;
      char bytes[64];
      const ssize_t count = ::read(read_end, bytes, sizeof bytes);
      if (count <= 0) continue;
      const bool terminate =
          std::find(bytes, bytes + count, static_cast<char>(SIGTERM)) != bytes + count;
      {
        const std::lock_guard lock(mutex_);
        for (const FlightRecorder* recorder : recorders_)
          recorder->dump(terminate ? "SIGTERM" : "SIGUSR1");
      }
      if (terminate) {
        ::signal(SIGTERM, SIG_DFL);
        ::raise(SIGTERM);
      }
    }
  }

  mutable std::mutex mutex_;
  std::vector<const FlightRecorder*> recorders_;
  bool tried_ = false;
  bool answers_sigusr1_ = false;
  bool answers_sigterm_ = false;
};

}  // namespace detail

// Whether SIGUSR1 makes the recorders that have a trace directory write their files: false before
// the first one has a directory, and where the program had a SIGUSR1 handler of its own.
inline bool flight_recorder_answers_sigusr1() {
  return detail::FlightRecorderSignal::instance().answers_sigusr1();
}
// The same for SIGTERM, after which the process ends.
inline bool flight_recorder_answers_sigterm() {
  return detail::FlightRecorderSignal::instance().answers_sigterm();
}

inline void FlightRecorder::set_trace_dir(std::filesystem::path dir) {
  const bool answer_signal = !dir.empty();
  {
    const std::lock_guard lock(mutex_);
    dir_ = std::move(dir);
  }
  if (answer_signal)
    detail::FlightRecorderSignal::instance().add(this);
  else
    detail::FlightRecorderSignal::instance().remove(this);
}

}  // namespace coltrain::comm
