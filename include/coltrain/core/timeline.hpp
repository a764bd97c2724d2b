#pragma once
// The timeline: what each rank did when, as a Chrome trace (JSON that Perfetto and chrome://tracing
// load), like Horovod's timeline. Collectives (on the thread that ran them: the caller's, or the
// communicator's progress thread for non-blocking calls such as the data-parallel gradient
// buckets, so they show beside the backward pass) and the trainer's phases (data, forward, loss,
// backward, allreduce wait, optimizer, other) are recorded.
//
//   COLTRAIN_TRACE=runs/trace.json mpiexec -n 2 ./mnist_convnet     # or --trace in the samples
//   -> runs/trace.rank0.json, runs/trace.rank1.json (one rank: runs/trace.json)
//   scripts/merge_traces runs/trace.json runs/trace.rank*.json      # one file, a process per rank
//
// Off by default and then free: every hook asks enabled(), one relaxed atomic load. When on, an
// event costs a clock read and a mutex; the file is written (atomically) when a trainer's fit()
// ends, by write(), and at exit. Times are microseconds on the wall clock (steady within a
// process), so that the ranks' files line up when merged. At most COLTRAIN_TRACE_EVENTS events are
// kept (default 1,000,000); later ones are counted, not kept.

#include <coltrain/core/atomic_file.hpp>
#include <coltrain/core/env_count.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json_string.hpp>
#include <coltrain/core/timer.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace coltrain {

class Timeline {
 public:
  // The process's timeline, on when COLTRAIN_TRACE names a file.
  static Timeline& instance() {
    static Timeline timeline;
    return timeline;
  }

  bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }

  // Starts recording into `file` (replacing COLTRAIN_TRACE's).
  void enable(std::filesystem::path file) {
    const std::lock_guard lock(mutex_);
    file_ = std::move(file);
    enabled_.store(!file_.empty(), std::memory_order_relaxed);
  }

  // This process's rank: its events' process, and its file's name when the job has several ranks
  // (trace.json -> trace.rank<R>.json). The first call counts; the communicator makes it.
  void set_process(int rank, int size) {
    const std::lock_guard lock(mutex_);
    if (rank_ >= 0) return;
    rank_ = rank;
    size_ = size;
  }

  // The file this process writes (empty when off).
  std::filesystem::path file() const {
    const std::lock_guard lock(mutex_);
    return file_for_rank();
  }

  // One finished span: `name` in `category`, from `start` to `end` on the calling thread, with
  // `args` a JSON object's members ("\"count\": 3") or empty; `process` -1 for this process's rank.
  void complete(std::string_view name, std::string_view category, Clock::time_point start,
                Clock::time_point end, std::string args = {}, int process = -1) {
    if (!enabled()) return;
    Event event{std::string(name), std::string(category),
                to_micros(start),  std::chrono::duration<double, std::micro>(end - start).count(),
                thread_number(),   process,
                std::move(args)};
    const std::lock_guard lock(mutex_);
    if (events_.size() >= capacity_) {
      ++dropped_;
      return;
    }
    events_.push_back(std::move(event));
  }

  // A span from construction to destruction, recorded only when the timeline is on.
  class [[nodiscard]] Span {
   public:
    Span(std::string_view name, std::string_view category)
        : on_(Timeline::instance().enabled()), name_(name), category_(category) {
      if (on_) start_ = Clock::now();
    }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;
    ~Span() {
      if (on_) Timeline::instance().complete(name_, category_, start_, Clock::now());
    }

   private:
    bool on_;
    std::string_view name_, category_;
    Clock::time_point start_{};
  };

  // Writes every event so far to file() (nothing when off). Returns the file written.
  std::filesystem::path write() const {
    std::string text;
    std::filesystem::path file;
    {
      const std::lock_guard lock(mutex_);
      if (!enabled()) return {};
      file = file_for_rank();
      text = to_json();
    }
    if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
    write_file_atomically(file, text);
    return file;
  }

  ~Timeline() {
    try {
      write();
    } catch (...) {
      // At exit there is no one left to tell.
    }
  }

 private:
  struct Event {
    std::string name, category;
    double start_us = 0, duration_us = 0;
    int thread = 0, process = -1;
    std::string args;
  };

  Timeline()
      : capacity_(
            detail::count_from_env("COLTRAIN_TRACE_EVENTS", 1'000'000, 100'000'000, "events")) {
    const char* file = std::getenv("COLTRAIN_TRACE");
    if (file != nullptr && *file != '\0') enable(file);
  }

  // Microseconds since the Unix epoch, read off the steady clock: monotonic here, comparable
  // across ranks to the wall clocks' agreement.
  double to_micros(Clock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count() +
           steady_to_unix_us_;
  }

  static int thread_number() {
    static std::atomic<int> next{0};
    thread_local const int number = next.fetch_add(1, std::memory_order_relaxed);
    return number;
  }

  std::filesystem::path file_for_rank() const {
    if (file_.empty() || size_ <= 1) return file_;
    std::filesystem::path ranked = file_;
    ranked.replace_filename(file_.stem().string() + ".rank" + std::to_string(rank_) +
                            file_.extension().string());
    return ranked;
  }

  std::string to_json() const {
    const int own = rank_ < 0 ? 0 : rank_;
    std::string out = "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"dropped_events\": " +
                      std::to_string(dropped_) + "}, \"traceEvents\": [\n";
    std::vector<int> processes{own};
    for (const Event& e : events_) {
      const int process = e.process < 0 ? own : e.process;
      if (std::find(processes.begin(), processes.end(), process) == processes.end())
        processes.push_back(process);
    }
    bool first = true;
    for (const int process : processes) {
      out += first ? "" : ",\n";
      first = false;
      out += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(process) +
             ", \"args\": {\"name\": \"rank " + std::to_string(process) + "\"}}";
    }
    char numbers[96];
    for (const Event& e : events_) {
      out += ",\n{\"name\": ";
      detail::append_json_string(out, e.name);
      out += ", \"cat\": ";
      detail::append_json_string(out, e.category);
      std::snprintf(numbers, sizeof numbers, ", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f",
                    e.start_us, e.duration_us);
      out += numbers;
      out += ", \"pid\": " + std::to_string(e.process < 0 ? own : e.process) +
             ", \"tid\": " + std::to_string(e.thread);
      if (!e.args.empty()) out += ", \"args\": {" + e.args + "}";
      out += '}';
    }
    out += "\n]}\n";
    return out;
  }

  mutable std::mutex mutex_;
  std::atomic<bool> enabled_{false};
  std::filesystem::path file_;
  int rank_ = -1;
  int size_ = 1;
  const std::size_t capacity_;
  std::vector<Event> events_;
  std::uint64_t dropped_ = 0;
  const double steady_to_unix_us_ =
      std::chrono::duration<double, std::micro>(std::chrono::system_clock::now().time_since_epoch())
          .count() -
      std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
};

}  // namespace coltrain
