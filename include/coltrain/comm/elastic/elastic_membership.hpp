#pragma once
// detail::ElasticMembership: the work behind ElasticGroup (comm/elastic/elastic_group.hpp), which
// holds the current communicator ("generation") and forms the next one when ranks die (shrink) or
// when processes started later ask to join (grow back), over fresh connections, without the
// launcher's help. Compiled once under separate compilation (comm/impl/elastic_group.ipp).
//
// Forming generation g (the first one at start, the same way after every change):
//   1. The leader, the lowest rank of generation g-1 that is alive, listens on its rendezvous
//      address (kept open for the job's life: joiners knock there). Every other rank opens a new
//      data listener, connects to the first leader candidate that answers and sends an
//      ElasticHello.
//   2. The leader accepts hellos until every rank it expects came (all but the ones named dead) or
//      regroup_window ends.
//   3. The leader numbers them: itself 0, the others by their old rank, joiners after; too few:
//      it says so, and stops. Every rank receives the table and its new rank.
//   4. All connect in a full mesh of the new ranks (tcp_rendezvous.hpp) with a fresh nonce, so no
//      message of an older generation can reach this one.
//
// Leader candidates are tried in order of old rank, so every survivor reaches the same leader
// without a vote: a candidate that does not answer within regroup_window is taken for dead. The
// rendezvous address of generation 1 is MASTER_ADDR:MASTER_PORT; a successor leader listens on
// MASTER_PORT at its own address (the one in the address table), which is MASTER_ADDR again when
// it shares the first leader's host. Joiners connect to MASTER_ADDR:MASTER_PORT, so they find the
// leader while it runs on that host (single-host jobs always; docs/fault-tolerance.md).
//
// Membership is not consensus: a rank that misses the leader's window (stopped for longer than
// it) is left out and fails with an error saying so, as a rank that died would.

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/elastic/elastic_options.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/rendezvous/tcp_rendezvous.hpp>
#include <coltrain/comm/transport/tcp/socket.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/log.hpp>
#include <coltrain/core/timer.hpp>

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::comm {

namespace detail {

inline constexpr std::uint32_t kElasticMagic = 0x4c455443u;  // "CTEL"
inline constexpr std::int32_t kJoiner = -1;

// A rank to the leader: who it was in the previous generation (or a joiner) and its new listener.
struct ElasticHello {
  std::uint32_t magic = kElasticMagic;
  std::uint32_t version = kTcpProtocolVersion;
  std::uint64_t job_hash = 0;
  std::uint32_t generation = 0;   // the one it wants to form (a joiner: 0, any)
  std::int32_t member = kJoiner;  // its rank in the previous generation
  PeerAddress data;
  std::uint32_t door_port = 0;  // where it listens when it leads, at data's address
  std::uint32_t auth = kHelloUnauthenticated;
  std::uint32_t reserved = 0;
};
static_assert(sizeof(ElasticHello) == 64 && std::has_unique_object_representations_v<ElasticHello>);

enum class ElasticStatus : std::uint32_t {
  kFormed = 0,
  kTooFew = 1,  // fewer ranks than min_ranks came: the job stops
};

// The leader to each rank, followed by world_size PeerAddress entries indexed by new rank (their
// `reserved` is the old rank + 1, 0 for a joiner), then world_size door ports.
struct ElasticTable {
  std::uint32_t magic = kElasticMagic;
  std::uint32_t version = kTcpProtocolVersion;
  std::uint32_t generation = 0;
  ElasticStatus status = ElasticStatus::kFormed;
  std::int32_t world_size = 0;
  std::int32_t your_rank = 0;
  std::uint64_t nonce = 0;
};
static_assert(sizeof(ElasticTable) == 32 && std::has_unique_object_representations_v<ElasticTable>);

// Why a hello at an elastic door is not from a process of this job, or empty. Which generation and
// member it claims is the leader's to judge, once it proved the secret.
inline std::string judge_elastic_hello(const ElasticHello& hello, std::uint64_t job_hash) {
  if (hello.magic != kElasticMagic || hello.version != kTcpProtocolVersion ||
      hello.job_hash != job_hash) {
    return "not a rank of this job (another protocol, version or COLTRAIN_JOB_ID)";
  }
  return {};
}

// The leader's rendezvous listener and the hellos that reached it, read without blocking so that
// a stranger that sends nothing holds up no one. With the job's secret a hello counts only once
// its sender proved the secret (tcp_handshake.hpp).
class ElasticDoor {
 public:
  struct Arrival {
    FileDescriptor socket;
    ElasticHello hello;
  };

  ElasticDoor() = default;
  ElasticDoor(FileDescriptor listener, std::uint64_t job_hash, HandshakeSecurity security,
              const Logger& logger)
      : listener_(std::move(listener)),
        job_hash_(job_hash),
        security_(security),
        dropped_(logger,
                 "the elastic rendezvous at " + local_endpoint(listener_.get()).to_string()) {}

  bool open() const { return static_cast<bool>(listener_); }
  Endpoint endpoint() const { return local_endpoint(listener_.get()); }

  // Accepts and reads hellos until `done()` holds or `deadline` passes; looks once without waiting
  // when `done()` holds already or the deadline has passed.
  template <class Done>
  void admit(const Deadline& deadline, const Done& done, const ErrorContext& context) {
    std::vector<pollfd> ready;
    for (bool finished = done();; finished = done()) {
      ready.assign(1, pollfd{listener_.get(), POLLIN, 0});
      for (Incoming& p : pending_) ready.push_back({p.socket().get(), POLLIN, 0});
      const int count =
          ::poll(ready.data(), ready.size(), finished ? 0 : poll_timeout_ms(deadline));
      if (count < 0 && errno != EINTR)
        throw_system_error("wait for elastic hellos", errno, context);
      for (std::size_t i = 0; count > 0 && i < pending_.size(); ++i) {
        if (ready[i + 1].revents != 0) settle(pending_[i]);
      }
      std::erase_if(pending_, [](Incoming& p) { return !p.socket(); });
      if (count > 0 && ready[0].revents != 0) {
        while (FileDescriptor socket = accept_connection(listener_.get(), context)) {
          pending_.emplace_back(std::move(socket));
          settle(pending_.back());  // a joiner's hello is usually there already
        }
        std::erase_if(pending_, [](Incoming& p) { return !p.socket(); });
      }
      if ((finished && done()) || deadline.expired()) {
        dropped_.summarise();
        return;
      }
    }
  }

  // Whether a connector was challenged and its proof is still to come.
  bool challenging() const {
    return std::ranges::any_of(pending_, [](const Incoming& p) { return p.challenged(); });
  }

  std::vector<Arrival>& arrivals() { return arrivals_; }
  std::size_t joiners() const {
    return static_cast<std::size_t>(std::ranges::count_if(
        arrivals_, [](const Arrival& a) { return a.hello.member == kJoiner; }));
  }

 private:
  using Incoming = IncomingHandshake<ElasticHello>;

  void settle(Incoming& connection) {
    const auto judge = [&](const ElasticHello& hello) {
      return judge_elastic_hello(hello, job_hash_);
    };
    switch (connection.advance(judge, security_)) {
      case Incoming::Status::kReading:
        return;
      case Incoming::Status::kAdmitted:
        arrivals_.push_back({std::move(connection.socket()), connection.hello()});
        return;
      case Incoming::Status::kDropped:
        dropped_.report(peer_name(connection.socket().get()), connection.reason());
        connection.socket().reset();
        return;
    }
  }

  FileDescriptor listener_;
  std::uint64_t job_hash_ = 0;
  HandshakeSecurity security_;
  DroppedConnections dropped_{Logger(0, 1), "the elastic rendezvous"};
  std::vector<Incoming> pending_;
  std::vector<Arrival> arrivals_;
};

class ElasticMembership {
  // How long a leader that has every rank it expects still waits for the ones named dead.
  static constexpr auto kLinger = std::chrono::milliseconds(200);
  // How long a look for joiners waits for the proofs of those it challenged (one round trip).
  static constexpr auto kProofWait = std::chrono::milliseconds(100);

 public:
  // Forms the first generation from the launcher's environment: the ranks of WORLD_SIZE that reach
  // rank 0 within COLTRAIN_TIMEOUT (at least min_ranks), or, with `elastic.join`, joins a running
  // job. Throws CommError or TimeoutError, ConfigError for bad addresses.
  ElasticMembership(const LaunchEnv& env, CommOptions options, ElasticOptions elastic)
      : env_(env),
        options_(std::move(options)),
        elastic_(elastic),
        logger_(env.rank, env.world_size),
        job_hash_(detail::hash_job_id(options_.job_id)) {
    ErrorContext context = error_context("elastic rendezvous");
    if (elastic_.min_ranks < 1) {
      throw InvalidArgument(
          "min_ranks is " + std::to_string(elastic_.min_ranks) + ", expected at least 1", context);
    }
    if (env_.master_port == 0) {
      // Joiners and later generations find the job at MASTER_PORT, long after the launch.
      throw ConfigError(
          "an elastic job needs a fixed MASTER_PORT, where joiners find it: 0 (a "
          "port the kernel picks, COLTRAIN_PORT_FILE) is for fixed-size jobs",
          context);
    }
    master_ = {detail::resolve_address(env_.master_addr, "MASTER_ADDR", context),
               static_cast<std::uint16_t>(env_.master_port)};
    own_address_ = detail::data_address_for(env_.master_addr, master_, options_, context);
    // Every rank listens at a door of its own, where it admits the next generation if it leads:
    // rank 0 at MASTER_ADDR:MASTER_PORT (the launch's rendezvous), the others on a port of the
    // kernel's choice, announced in every table. A candidate that died refuses at once.
    const bool launch_leader = !elastic_.join && env_.rank == 0;
    const detail::Endpoint door =
        launch_leader ? detail::rendezvous_listen_endpoint(env_.master_addr, master_)
                      : detail::Endpoint{own_address_, 0};
    detail::check_door_security(door.address, options_, logger_, context);
    door_ = detail::ElasticDoor(
        detail::listen_tcp(door, 0,
                           launch_leader ? "the elastic rendezvous (MASTER_ADDR:MASTER_PORT)"
                                         : "the elastic rendezvous of a later generation",
                           context),
        job_hash_, detail::handshake_security(options_, "elastic"), logger_);
    if (elastic_.join) {
      join();
      return;
    }
    // Generation 0 is the launch: WORLD_SIZE ranks, rank 0 leads.
    rank_ = env_.rank;
    size_ = env_.world_size;
    form({}, options_.timeout, false);
  }

  ElasticMembership(const ElasticMembership&) = delete;
  ElasticMembership& operator=(const ElasticMembership&) = delete;

  Communicator& communicator() { return *communicator_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int generation() const { return generation_; }
  const ElasticOptions& options() const { return elastic_; }

  // After a collective failed: closes the communicator and forms the next generation of the ranks
  // that are alive, expecting all but `failed` (ranks of this generation known dead). Returns what
  // changed. Throws CommError naming the count when fewer than min_ranks remain, and when this rank
  // was left out.
  MembershipChange regroup(const std::vector<int>& failed) {
    communicator_.reset();
    return form(failed, elastic_.regroup_window, false);
  }

  // The leader: how many processes wait at its door to join; 0 on the other ranks. Never blocks.
  int joiners_waiting() {
    if (!leading_) return 0;
    std::size_t waiting = 0;
    for (detail::ElasticDoor* door : {&door_, &joiner_door_}) {
      if (!door->open()) continue;
      door->admit(
          Deadline(kProofWait), [&] { return !door->challenging(); },
          error_context("elastic rendezvous"));
      waiting += door->joiners();
    }
    return static_cast<int>(waiting);
  }

  // Every rank, once they agreed that joiners wait (an epoch start): closes the communicator and
  // forms the next generation with them.
  MembershipChange admit_joiners() {
    communicator_.reset();
    return form({}, elastic_.regroup_window, true);
  }

  // Whether this rank leads: rank 0 of the generation, or the leader of a regroup that failed.
  bool leading() const { return leading_; }

 private:
  ErrorContext error_context(std::string operation) const {
    ErrorContext context;
    context.rank = rank_;
    context.operation = std::move(operation);
    return context;
  }

  // Where candidate `rank` of this generation admits the next one.
  detail::Endpoint rendezvous_of(int rank) const {
    if (generation_ == 0) return master_;
    const auto r = static_cast<std::size_t>(rank);
    return {addresses_[r], doors_[r]};
  }

  // Forms the next generation. `window`: how long the leader waits for the ranks it expects and a
  // rank for a candidate to answer (at launch: COLTRAIN_TIMEOUT, and rank 0 is the only candidate).
  // Joiners come in only with `with_joiners` (an epoch start, where they can begin); otherwise
  // they keep waiting at the door.
  MembershipChange form(const std::vector<int>& failed, std::chrono::milliseconds window,
                        bool with_joiners) {
    const Stopwatch elapsed;
    const Deadline deadline(window);
    const int target = generation_ + 1;
    MembershipChange change;
    change.previous_size = size_;
    const detail::FileDescriptor data_listener =
        detail::listen_tcp({own_address_, 0}, detail::kSocketBufferBytes,
                           "data connections of the next generation", error_context("regroup"));
    std::optional<Formed> formed;
    for (int candidate = 0; candidate <= rank_ && !formed; ++candidate) {
      if (candidate != rank_ && std::ranges::find(failed, candidate) != failed.end()) continue;
      formed = candidate == rank_ ? lead(target, failed, data_listener, deadline, with_joiners)
                                  : follow(candidate, target, data_listener, window);
      if (!formed && generation_ == 0) {
        throw PeerLostError("rank 0 closed the elastic rendezvous at " + master_.to_string() +
                                " before sending this rank its place",
                            error_context("elastic rendezvous"));
      }
    }
    std::vector<detail::FileDescriptor> mesh = detail::connect_full_mesh(
        formed->rank, static_cast<int>(formed->table.entries.size()), formed->table, data_listener,
        job_hash_, options_, logger_, error_context("regroup"));
    change.departed = formed->departed;
    change.joined = formed->joined;
    rank_ = formed->rank;
    size_ = static_cast<int>(formed->table.entries.size());
    addresses_.clear();
    for (const detail::PeerAddress& entry : formed->table.entries)
      addresses_.push_back(entry.endpoint().address);
    doors_ = formed->doors;
    generation_ = target;
    LaunchEnv env = env_;
    env.rank = rank_;
    env.world_size = size_;
    env.local_world_size = std::min(env.local_world_size.value_or(size_), size_);
    logger_ = Logger(rank_, size_);
    communicator_.emplace(Communicator::tcp(rank_, std::move(mesh), env, options_));
    change.generation = generation_;
    change.size = size_;
    change.seconds = elapsed.seconds();
    return change;
  }

  struct Formed {
    int rank = 0;
    int generation = 0;
    detail::AddressTable table;
    std::vector<std::uint16_t> doors;  // by new rank
    std::vector<int> departed;
    int joined = 0;
  };

  // This rank leads generation `target`: admits the ranks it expects (and, at an epoch start,
  // joiners), and sends each its table.
  Formed lead(int target, const std::vector<int>& failed,
              const detail::FileDescriptor& data_listener, const Deadline& deadline,
              bool with_joiners) {
    const ErrorContext context = error_context("lead the elastic rendezvous");
    leading_ = true;
    open_joiner_door(context);
    std::vector<int> expected;
    for (int r = rank_ + 1; r < size_; ++r)
      if (std::ranges::find(failed, r) == failed.end()) expected.push_back(r);
    auto current = [&](const detail::ElasticDoor::Arrival& a) {
      return a.hello.generation == static_cast<std::uint32_t>(target) && a.hello.member > rank_ &&
             a.hello.member < size_;
    };
    auto all_came = [&] {
      return std::ranges::all_of(expected, [&](int r) {
        return std::ranges::any_of(door_.arrivals(), [&](const detail::ElasticDoor::Arrival& a) {
          return current(a) && a.hello.member == r;
        });
      });
    };
    door_.admit(deadline, all_came, context);
    // A rank wrongly named dead (a survivor blamed its neighbour) still gets a moment to come.
    auto everyone_came = [&] {
      for (int r = rank_ + 1; r < size_; ++r)
        if (std::ranges::none_of(door_.arrivals(),
                                 [&](const auto& a) { return current(a) && a.hello.member == r; }))
          return false;
      return true;
    };
    if (!failed.empty()) {
      door_.admit(Deadline(std::min<Clock::duration>(kLinger, deadline.remaining())), everyone_came,
                  context);
    }

    if (joiner_door_.open())
      joiner_door_.admit(
          Deadline(Clock::duration::zero()), [] { return false; }, context);

    // Members by old rank, then joiners in arrival order; stale hellos (an older generation, a
    // duplicate) are turned away by closing their connection.
    std::vector<detail::ElasticDoor::Arrival> members, joiners;
    for (detail::ElasticDoor* door : {&door_, &joiner_door_}) {
      std::vector<detail::ElasticDoor::Arrival> waiting;
      for (detail::ElasticDoor::Arrival& a : door->arrivals()) {
        const bool duplicate = std::ranges::any_of(
            members, [&](const auto& m) { return m.hello.member == a.hello.member; });
        if (a.hello.member == detail::kJoiner)
          (with_joiners ? joiners : waiting).push_back(std::move(a));
        else if (current(a) && !duplicate)
          members.push_back(std::move(a));
      }
      door->arrivals() = std::move(waiting);
    }
    std::ranges::sort(members, {},
                      [](const detail::ElasticDoor::Arrival& a) { return a.hello.member; });

    Formed formed;
    const int world = 1 + static_cast<int>(members.size() + joiners.size());
    const bool too_few = world < elastic_.min_ranks;
    formed.table.nonce = detail::make_nonce();
    const detail::Endpoint own = detail::local_endpoint(data_listener.get());
    // An entry's `reserved` carries its old rank + 1 (0: a joiner), so every rank can tell what
    // changed.
    formed.table.entries.push_back(
        detail::PeerAddress::of(own, static_cast<std::uint16_t>(rank_ + 1)));
    formed.doors.push_back(door_.endpoint().port);
    std::vector<detail::ElasticDoor::Arrival*> order;
    for (auto* group : {&members, &joiners})
      for (auto& a : *group) {
        order.push_back(&a);
        detail::PeerAddress entry = a.hello.data;
        entry.reserved = static_cast<std::uint16_t>(a.hello.member + 1);
        formed.table.entries.push_back(entry);
        formed.doors.push_back(static_cast<std::uint16_t>(a.hello.door_port));
      }
    describe_change(formed);
    const Deadline send_deadline(options_.timeout);
    for (std::size_t i = 0; i < order.size(); ++i) {
      const detail::ElasticTable header{
          detail::kElasticMagic,
          detail::kTcpProtocolVersion,
          static_cast<std::uint32_t>(target),
          too_few ? detail::ElasticStatus::kTooFew : detail::ElasticStatus::kFormed,
          world,
          static_cast<std::int32_t>(i + 1),
          formed.table.nonce};
      const std::size_t entries = formed.table.entries.size() * sizeof(detail::PeerAddress);
      std::vector<std::byte> message(sizeof header + entries +
                                     formed.doors.size() * sizeof(std::uint16_t));
      std::memcpy(message.data(), &header, sizeof header);
      std::memcpy(message.data() + sizeof header, formed.table.entries.data(), entries);
      std::memcpy(message.data() + sizeof header + entries, formed.doors.data(),
                  formed.doors.size() * sizeof(std::uint16_t));
      // A rank that left meanwhile fails the mesh below, with its own error.
      (void)detail::send_exact(order[i]->socket.get(), message, send_deadline);
    }
    if (too_few) throw_too_few(world);
    if (generation_ == 0 && !formed.departed.empty()) {
      std::ostringstream missing;
      for (const int r : formed.departed) missing << (missing.tellp() > 0 ? ", " : "") << r;
      logger_.warn("ranks never at the rendezvous at ", master_.to_string(), ": ", missing.str(),
                   "; the job starts with ", world, " ranks");
    }
    formed.rank = 0;
    return formed;
  }

  // Joiners knock at MASTER_PORT. A leader whose own door is elsewhere (the first leader died)
  // opens one there too when the port is free on its host; when it is held (by a stopped first
  // leader, or on another host), joiners must be pointed at this leader's door.
  void open_joiner_door(const ErrorContext& context) {
    if (joiner_door_.open() || door_.endpoint().port == master_.port) return;
    try {
      joiner_door_ = detail::ElasticDoor(
          detail::listen_tcp({own_address_, master_.port}, 0, "joiners (MASTER_PORT)", context),
          job_hash_, detail::handshake_security(options_, "elastic"), logger_);
    } catch (const Error& e) {
      logger_.warn("no door for joiners at MASTER_PORT (", e.message(),
                   "); joiners must use this leader's door at ", door_.endpoint().to_string());
    }
  }

  // Asks candidate `leader` for a place in generation `target`. nullopt: it did not answer (it is
  // dead, or was left out itself), so the next candidate is tried.
  std::optional<Formed> follow(int leader, int target, const detail::FileDescriptor& data_listener,
                               std::chrono::milliseconds window) {
    ErrorContext context = error_context("join the elastic rendezvous");
    context.peer = leader;
    const detail::Endpoint at = rendezvous_of(leader);
    detail::FileDescriptor socket;
    if (generation_ == 0) {  // the launch: rank 0 may not listen yet
      socket = detail::connect_with_retry(at, 0, Deadline(window), "rank 0's elastic rendezvous",
                                          window, context);
    } else {  // a candidate's door is open while it lives: a refusal means it died
      socket = detail::make_tcp_socket(at.address.family, context);
      if (const int error = detail::try_connect(socket.get(), at, Deadline(window)); error != 0) {
        logger_.warn("leader candidate rank ", leader, " did not answer at ", at.to_string(), " (",
                     detail::errno_text(error), "); taking it for dead");
        return std::nullopt;
      }
    }
    const detail::Endpoint own = detail::local_endpoint(data_listener.get());
    const detail::ElasticHello hello{detail::kElasticMagic,
                                     detail::kTcpProtocolVersion,
                                     job_hash_,
                                     static_cast<std::uint32_t>(target),
                                     rank_,
                                     detail::PeerAddress::of(own),
                                     door_.endpoint().port};
    std::optional<Formed> formed =
        receive_table(socket, hello, Deadline(options_.timeout + window), context);
    if (formed) leading_ = false;
    return formed;
  }

  void join() {
    size_ = 0;  // no generation yet: the table's change is all joiners
    ErrorContext context = error_context("join a running elastic job");
    const detail::FileDescriptor data_listener = detail::listen_tcp(
        {own_address_, 0}, detail::kSocketBufferBytes, "data connections", context);
    const Deadline deadline(elastic_.join_timeout);
    detail::FileDescriptor socket = detail::connect_with_retry(
        master_, 0, deadline, "the elastic job's rendezvous (MASTER_ADDR:MASTER_PORT)",
        elastic_.join_timeout, context);
    const detail::Endpoint own = detail::local_endpoint(data_listener.get());
    const detail::ElasticHello hello{
        detail::kElasticMagic,        detail::kTcpProtocolVersion, job_hash_, 0, detail::kJoiner,
        detail::PeerAddress::of(own), door_.endpoint().port};
    const Stopwatch elapsed;
    std::optional<Formed> formed = receive_table(socket, hello, deadline, context);
    if (!formed) {
      throw PeerLostError("the elastic job at " + master_.to_string() +
                              " closed the connection before admitting this process",
                          context);
    }
    const int world = static_cast<int>(formed->table.entries.size());
    std::vector<detail::FileDescriptor> mesh = detail::connect_full_mesh(
        formed->rank, world, formed->table, data_listener, job_hash_, options_, logger_, context);
    rank_ = formed->rank;
    size_ = world;
    for (const detail::PeerAddress& entry : formed->table.entries)
      addresses_.push_back(entry.endpoint().address);
    doors_ = formed->doors;
    generation_ = formed->generation;
    LaunchEnv env = env_;
    env.rank = rank_;
    env.world_size = size_;
    logger_ = Logger(rank_, size_);
    communicator_.emplace(Communicator::tcp(rank_, std::move(mesh), env, options_));
    logger_.info("joined the elastic job as rank ", rank_, " of ", size_, " after ",
                 elapsed.seconds(), " s");
  }

  std::optional<Formed> receive_table(const detail::FileDescriptor& socket,
                                      const detail::ElasticHello& hello, const Deadline& deadline,
                                      const ErrorContext& context) {
    detail::ElasticTable header;
    detail::IoResult io =
        detail::offer_hello(socket.get(), hello, detail::handshake_security(options_, "elastic"),
                            deadline, "the elastic rendezvous leader", context);
    if (io.status == detail::IoStatus::kDone)
      io = detail::recv_exact(socket.get(), detail::writable_bytes_of_value(header), deadline);
    if (io.status == detail::IoStatus::kClosed) return std::nullopt;
    if (io.status == detail::IoStatus::kTimedOut) {
      throw TimeoutError(
          "the elastic rendezvous leader admitted this rank to no generation in time; it was "
          "left out (stopped for longer than the leader's window?)",
          context);
    }
    if (header.magic != detail::kElasticMagic || header.version != detail::kTcpProtocolVersion ||
        header.world_size < 1 || header.your_rank < 1 || header.your_rank >= header.world_size) {
      throw MismatchError("the elastic rendezvous answered with something other than a table",
                          context);
    }
    if (header.status == detail::ElasticStatus::kTooFew) throw_too_few(header.world_size);
    Formed formed;
    formed.rank = header.your_rank;
    formed.table.nonce = header.nonce;
    formed.table.entries.resize(static_cast<std::size_t>(header.world_size));
    formed.doors.resize(formed.table.entries.size());
    io = detail::recv_exact(socket.get(), std::as_writable_bytes(std::span(formed.table.entries)),
                            deadline);
    if (io.status == detail::IoStatus::kDone)
      io = detail::recv_exact(socket.get(), std::as_writable_bytes(std::span(formed.doors)),
                              deadline);
    if (io.status != detail::IoStatus::kDone) return std::nullopt;
    formed.generation = static_cast<int>(header.generation);
    describe_change(formed);
    return formed;
  }

  // Which ranks of this generation the table leaves out, and how many joiners it brings.
  void describe_change(Formed& formed) const {
    for (int r = 0; r < size_; ++r) {
      if (std::ranges::none_of(formed.table.entries,
                               [&](const detail::PeerAddress& e) { return e.reserved == r + 1; }))
        formed.departed.push_back(r);
    }
    formed.joined = static_cast<int>(std::ranges::count_if(
        formed.table.entries, [](const detail::PeerAddress& e) { return e.reserved == 0; }));
  }

  [[noreturn]] void throw_too_few(int world) const {
    throw CommError("only " + std::to_string(world) + (world == 1 ? " rank is" : " ranks are") +
                        " left, fewer than the " + std::to_string(elastic_.min_ranks) +
                        " the job needs (--min-ranks); stopping",
                    error_context("regroup"));
  }

  LaunchEnv env_;
  CommOptions options_;
  ElasticOptions elastic_;
  Logger logger_;
  std::uint64_t job_hash_;
  detail::Endpoint master_;
  detail::IpAddress own_address_;
  int rank_ = 0;
  int size_ = 1;
  int generation_ = 0;
  std::vector<detail::IpAddress> addresses_;  // each rank's host, by rank of this generation
  std::vector<std::uint16_t> doors_;          // each rank's door port, likewise
  bool leading_ = false;
  std::optional<Communicator> communicator_;
  // Declared last, so closed first: a successor can take MASTER_PORT once the connections close.
  detail::ElasticDoor door_;         // this rank's own, where it admits a generation it leads
  detail::ElasticDoor joiner_door_;  // a successor leader's at MASTER_PORT
};

}  // namespace detail

}  // namespace coltrain::comm
