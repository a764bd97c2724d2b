#pragma once
// Bootstrapping a TCP job: from the launcher's MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE to one
// connected socket per pair of ranks.
//
// 0. Every rank makes sure its open-file limit has room for a socket per peer
//    (descriptor_limit.hpp): raised if only the soft limit is short, a ConfigError naming the fix
//    if the hard one is. Likewise its memory limits (memory_limit.hpp: cgroup, RLIMIT_AS) must
//    leave room for its connections.
// 1. Every rank opens a data listener on an ephemeral port, on the address of
//    COLTRAIN_SOCKET_IFNAME, else on the address this host uses to reach MASTER_ADDR.
// 2. Rank 0 listens on MASTER_ADDR:MASTER_PORT (with MASTER_PORT=0 on a port the kernel picks,
//    published in COLTRAIN_PORT_FILE: port_file.hpp); ranks 1..n-1 connect (retrying, so ranks may
//    start in any order) and send a RendezvousHello with their data address. Rank 0 checks each
//    hello and drops, with a warning, any connection that is not a rank of this job: a port scanner
//    or a process of another job must not disturb this one.
// 3. Rank 0 sends every rank the address table and a nonce it drew for this job, then closes the
//    rendezvous port, so that the next job or communicator can bind it. If ranks are missing at the
//    deadline, the table it sends instead names them, so every rank's TimeoutError says who never
//    came.
// 4. Full mesh: for each pair, the higher rank connects to the lower rank's data listener and
//    sends a MeshHello carrying the nonce; the lower rank admits only hellos with this job's nonce.
//
// With the job's secret (COLTRAIN_AUTH_TOKEN or COLTRAIN_AUTH_FILE) every connection of steps 2
// and 4 also proves the secret both ways (tcp_handshake.hpp), and only a rank that proved it can
// claim a rank: a stranger cannot take a rank's place or learn the table.
//
// Handshakes travel in host byte order, as message headers do: a job's ranks share one
// architecture. Every step is bounded by CommOptions::timeout (COLTRAIN_TIMEOUT).

#include <coltrain/comm/options.hpp>
#include <coltrain/comm/rendezvous/descriptor_limit.hpp>
#include <coltrain/comm/rendezvous/memory_limit.hpp>
#include <coltrain/comm/rendezvous/port_file.hpp>
#include <coltrain/comm/rendezvous/tcp_handshake.hpp>
#include <coltrain/comm/transport/tcp/socket.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/log.hpp>
#include <coltrain/core/timer.hpp>

#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::comm::detail {

inline constexpr std::uint32_t kRendezvousMagic = 0x56525443u;  // "CTRV" in little-endian order
inline constexpr std::uint32_t kMeshMagic = 0x484d5443u;        // "CTMH"
inline constexpr std::uint32_t kTcpProtocolVersion = 2;  // 2: `auth` in hellos, IPv6 addresses

// Where a rank listens, as hellos and tables carry it (IPv4 in the first 4 bytes of `address`).
struct PeerAddress {
  std::array<std::uint8_t, 16> address{};
  std::uint32_t scope = 0;  // an IPv6 link-local address's interface
  std::uint16_t family = 0;
  std::uint16_t port = 0;  // 0: no such rank (it never came)
  std::uint16_t reserved = 0;
  std::uint16_t unused = 0;

  static PeerAddress of(const Endpoint& endpoint, std::uint16_t reserved = 0) {
    return {endpoint.address.bytes,
            endpoint.address.scope,
            endpoint.address.family,
            endpoint.port,
            reserved,
            0};
  }
  Endpoint endpoint() const { return {{family, address, scope}, port}; }
};
static_assert(sizeof(PeerAddress) == 28 && std::has_unique_object_representations_v<PeerAddress>);

// Rank r > 0 to rank 0: who I am and where my data listener is.
struct RendezvousHello {
  std::uint32_t magic = kRendezvousMagic;
  std::uint32_t version = kTcpProtocolVersion;
  std::int32_t world_size = 0;
  std::int32_t rank = 0;
  std::uint64_t job_hash = 0;
  PeerAddress data;
  std::uint32_t auth = kHelloUnauthenticated;
};
static_assert(sizeof(RendezvousHello) == 56 &&
              std::has_unique_object_representations_v<RendezvousHello>);

enum class TableStatus : std::uint32_t {
  kComplete = 0,
  kRanksMissing = 1,  // rank 0 gave up; entries with port 0 are the ranks that never came
};

// Rank 0 to every rank, followed by world_size PeerAddress entries indexed by rank.
struct RendezvousTable {
  std::uint32_t magic = kRendezvousMagic;
  std::uint32_t version = kTcpProtocolVersion;
  std::int32_t world_size = 0;
  TableStatus status = TableStatus::kComplete;
  std::uint64_t nonce = 0;
};
static_assert(sizeof(RendezvousTable) == 24 &&
              std::has_unique_object_representations_v<RendezvousTable>);

// The higher rank of a pair to the lower one, first thing on their data connection.
struct MeshHello {
  std::uint32_t magic = kMeshMagic;
  std::uint32_t version = kTcpProtocolVersion;
  std::int32_t world_size = 0;
  std::int32_t rank = 0;
  std::uint64_t job_hash = 0;
  std::uint64_t nonce = 0;
  std::uint32_t auth = kHelloUnauthenticated;
  std::uint32_t reserved = 0;
};
static_assert(sizeof(MeshHello) == 40 && std::has_unique_object_representations_v<MeshHello>);

// FNV-1a: the same on every rank and every build, unlike std::hash.
inline std::uint64_t hash_job_id(std::string_view job_id) {
  std::uint64_t hash = 14695981039346656037ull;
  for (const char c : job_id) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ull;
  }
  return hash;
}

// Distinguishes this job's mesh connections from those of an earlier run with the same job id.
inline std::uint64_t make_nonce() {
  std::random_device device;
  const std::uint64_t random = (std::uint64_t{device()} << 32) ^ device();
  return random ^ static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
}

// "rank 2" or "ranks 2, 4"
inline std::string describe_ranks(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return text;
}

// Why `claimed` may not connect to a door for ranks [first_rank, world_size), or empty.
inline std::string judge_claimed_rank(int claimed, int first_rank, int world_size) {
  if (claimed >= first_rank && claimed < world_size) return {};
  return "it claims rank " + std::to_string(claimed) + ", but only ranks " +
         std::to_string(first_rank) + " to " + std::to_string(world_size - 1) + " connect here";
}

// Why a hello at rank 0's rendezvous is not from a rank of this job, or empty.
inline std::string judge_rendezvous_hello(const RendezvousHello& hello, int first_rank,
                                          int world_size, std::uint64_t job_hash) {
  if (hello.magic != kRendezvousMagic) return "it does not speak coltrain's rendezvous protocol";
  if (hello.version != kTcpProtocolVersion) {
    return "it speaks protocol version " + std::to_string(hello.version) + ", this rank " +
           std::to_string(kTcpProtocolVersion);
  }
  if (hello.world_size != world_size) {
    return "it belongs to a job of " + std::to_string(hello.world_size) + " ranks, this one has " +
           std::to_string(world_size) + " (WORLD_SIZE differs)";
  }
  if (hello.job_hash != job_hash) return "it belongs to another job (COLTRAIN_JOB_ID differs)";
  return judge_claimed_rank(hello.rank, first_rank, world_size);
}

// Why a hello at a data listener is not from a rank of this job's current mesh, or empty.
inline std::string judge_mesh_hello(const MeshHello& hello, int first_rank, int world_size,
                                    std::uint64_t job_hash, std::uint64_t nonce) {
  if (hello.magic != kMeshMagic) return "it does not speak coltrain's mesh protocol";
  if (hello.version != kTcpProtocolVersion || hello.world_size != world_size ||
      hello.job_hash != job_hash || hello.nonce != nonce) {
    return "it belongs to another job, or to an earlier run of this one";
  }
  return judge_claimed_rank(hello.rank, first_rank, world_size);
}

template <class Hello>
struct Arrival {
  FileDescriptor socket;
  Hello hello;
};

// Accepts connections on `listener` and runs each one's handshake (tcp_handshake.hpp) until every
// rank in [first_rank, world_size) has arrived or `deadline` passes. `judge(hello)` returns why a
// hello is not from a rank of this job that connects here (a rank in that range), or an empty
// string. Rejected connections are closed and logged; the
// wait goes on. Connections are read concurrently, so a stranger that sends nothing holds up no
// one, and a rank counts only once its handshake is complete (with a secret: proved), so a
// stranger cannot take a rank's place. Returns the arrivals indexed by rank; ranks that never came
// have an empty socket.
template <class Hello, class Judge>
std::vector<Arrival<Hello>> collect_handshakes(int listener, int first_rank, int world_size,
                                               const Deadline& deadline, const Judge& judge,
                                               const HandshakeSecurity& security,
                                               const std::string& place, const Logger& logger,
                                               const ErrorContext& context) {
  using Incoming = IncomingHandshake<Hello>;
  std::vector<Arrival<Hello>> arrivals(static_cast<std::size_t>(world_size));
  int missing = world_size - first_rank;
  std::vector<Incoming> pending;
  std::vector<pollfd> ready;
  DroppedConnections dropped(logger, place);
  const auto settle = [&](Incoming& connection) {
    if (connection.advance(judge, security) == Incoming::Status::kReading) return;
    const int rank = connection.hello().rank;
    if (connection.status() == Incoming::Status::kAdmitted &&
        arrivals[static_cast<std::size_t>(rank)].socket) {
      dropped.report(
          peer_name(connection.socket().get()),
          "it claims rank " + std::to_string(rank) + ", which an earlier connection already holds");
    } else if (connection.status() == Incoming::Status::kAdmitted) {
      logger.debug("rank ", rank, " arrived at ", place, " from ",
                   peer_name(connection.socket().get()));
      arrivals[static_cast<std::size_t>(rank)] = {std::move(connection.socket()),
                                                  connection.hello()};
      --missing;
    } else {
      dropped.report(peer_name(connection.socket().get()), connection.reason());
    }
    connection.socket().reset();
  };
  while (missing > 0 && !deadline.expired()) {
    ready.assign(1, pollfd{listener, POLLIN, 0});
    for (Incoming& connection : pending) ready.push_back({connection.socket().get(), POLLIN, 0});
    const int count = ::poll(ready.data(), ready.size(), poll_timeout_ms(deadline));
    if (count < 0 && errno != EINTR) {
      throw_system_error("wait for connections to " + place, errno, context);
    }
    if (count <= 0) continue;
    for (std::size_t i = 0; i < pending.size(); ++i) {
      if (ready[i + 1].revents != 0) settle(pending[i]);
    }
    std::erase_if(pending, [](Incoming& connection) { return !connection.socket(); });
    if (ready[0].revents != 0) {
      while (FileDescriptor socket = accept_connection(listener, context)) {
        pending.emplace_back(std::move(socket));
      }
    }
  }
  dropped.summarise();
  return arrivals;
}

template <class Hello>
std::vector<int> missing_ranks(const std::vector<Arrival<Hello>>& arrivals, int first_rank) {
  std::vector<int> missing;
  for (std::size_t rank = static_cast<std::size_t>(first_rank); rank < arrivals.size(); ++rank) {
    if (!arrivals[rank].socket) missing.push_back(static_cast<int>(rank));
  }
  return missing;
}

// What rank 0 and every rank that reached it report when ranks never came to the rendezvous.
inline std::string never_arrived_message(const std::vector<int>& missing, const Endpoint& master,
                                         Clock::duration timeout) {
  return describe_ranks(missing) + " never arrived: no connection from " +
         (missing.size() == 1 ? "it" : "them") + " to the rendezvous at " + master.to_string() +
         " (MASTER_ADDR:MASTER_PORT) within " + format_seconds(timeout) + " (COLTRAIN_TIMEOUT)";
}

// The outcome of the rendezvous: every rank's data listener, and this job's nonce.
struct AddressTable {
  std::uint64_t nonce = 0;
  std::vector<PeerAddress> entries;
};

// Where rank 0 listens for the rendezvous (and an elastic job's first leader for joiners): on
// loopback when MASTER_ADDR says loopback, else on every address of this host, so that peers reach
// it by whatever MASTER_ADDR resolves to on their hosts.
inline Endpoint rendezvous_listen_endpoint(const std::string& master_addr, const Endpoint& master) {
  return names_loopback_only(master_addr)
             ? master
             : Endpoint{IpAddress::any(master.address.family), master.port};
}

// The address a rank listens on for data connections and announces to the others:
// COLTRAIN_SOCKET_IFNAME's; else the one this host uses to reach MASTER_ADDR; but when that is
// loopback although MASTER_ADDR names a host (its name mapped to 127.0.1.1 here), an address other
// hosts can reach, if this host has one.
inline IpAddress data_address_for(const std::string& master_addr, const Endpoint& master,
                                  const CommOptions& options, const ErrorContext& context) {
  if (!options.socket_ifname.empty()) {
    return interface_address(options.socket_ifname, master.address.family, context);
  }
  const IpAddress toward_master = route_source_address(master, context);
  if (!toward_master.is_loopback() || names_loopback_only(master_addr)) return toward_master;
  return outward_address(master.address.family).value_or(toward_master);
}

// Rank 0's door for the rendezvous: listening on MASTER_PORT, or with MASTER_PORT=0 on a port the
// kernel picks, which `master.port` then holds.
inline FileDescriptor open_rendezvous(const std::string& master_addr, Endpoint& master,
                                      const CommOptions& options, const Logger& logger,
                                      const ErrorContext& context) {
  const Endpoint door = rendezvous_listen_endpoint(master_addr, master);
  check_door_security(door.address, options, logger, context);
  FileDescriptor listener =
      listen_tcp(door, 0, "the rendezvous (MASTER_ADDR:MASTER_PORT)", context);
  master.port = local_endpoint(listener.get()).port;
  return listener;
}

// Rank 0's side: waits at `listener` for ranks 1..n-1, then sends everyone the table.
inline AddressTable serve_rendezvous(FileDescriptor listener, const Endpoint& master,
                                     const Endpoint& own_data, int world_size,
                                     std::uint64_t job_hash, const CommOptions& options,
                                     const Deadline& deadline, const Logger& logger,
                                     const ErrorContext& context) {
  const auto judge = [&](const RendezvousHello& hello) {
    return judge_rendezvous_hello(hello, 1, world_size, job_hash);
  };
  const auto arrivals = collect_handshakes<RendezvousHello>(
      listener.get(), 1, world_size, deadline, judge, handshake_security(options, "rendezvous"),
      "the rendezvous at " + master.to_string(), logger, context);
  listener.reset();  // MASTER_PORT is free for the next job from here on
  if (!options.port_file.empty()) withdraw_port_file(options.port_file);

  const std::vector<int> missing = missing_ranks(arrivals, 1);
  AddressTable table{make_nonce(), std::vector<PeerAddress>(static_cast<std::size_t>(world_size))};
  table.entries[0] = PeerAddress::of(own_data);
  for (std::size_t rank = 1; rank < arrivals.size(); ++rank) {
    if (arrivals[rank].socket) {
      table.entries[rank] = arrivals[rank].hello.data;
    }
  }
  const RendezvousTable header{
      kRendezvousMagic, kTcpProtocolVersion, world_size,
      missing.empty() ? TableStatus::kComplete : TableStatus::kRanksMissing, table.nonce};
  std::vector<std::byte> message(sizeof header + table.entries.size() * sizeof(PeerAddress));
  std::memcpy(message.data(), &header, sizeof header);
  std::memcpy(message.data() + sizeof header, table.entries.data(),
              table.entries.size() * sizeof(PeerAddress));

  const Deadline send_deadline(options.timeout);
  for (std::size_t rank = 1; rank < arrivals.size(); ++rank) {
    if (!arrivals[rank].socket) continue;
    const IoResult sent = send_exact(arrivals[rank].socket.get(), message, send_deadline);
    // When ranks are missing, the table is a courtesy to the others; the TimeoutError below counts.
    if (sent.status == IoStatus::kDone || !missing.empty()) continue;
    ErrorContext peer_context = context;
    peer_context.peer = static_cast<int>(rank);
    if (sent.status == IoStatus::kTimedOut) {
      throw TimeoutError("rank " + std::to_string(rank) +
                             " did not take the address table within " +
                             format_seconds(options.timeout) + " (COLTRAIN_TIMEOUT)",
                         peer_context);
    }
    throw PeerLostError("rank " + std::to_string(rank) +
                            " left the rendezvous before receiving the address table (" +
                            sent.reason + ")",
                        peer_context);
  }
  if (!missing.empty()) {
    throw TimeoutError(never_arrived_message(missing, master, options.timeout), context);
  }
  return table;
}

// Rank 0 answers within its own timeout, which began before it accepted our connection; this much
// more lets its answer reach us even when it names missing ranks at the last moment.
inline constexpr auto kRendezvousAnswerGrace = std::chrono::seconds(2);

// The side of ranks 1..n-1: registers with rank 0 and receives the table.
inline AddressTable join_rendezvous(const Endpoint& master, const Endpoint& own_data, int rank,
                                    int world_size, std::uint64_t job_hash,
                                    const CommOptions& options, const Deadline& deadline,
                                    const ErrorContext& context) {
  ErrorContext peer_context = context;
  peer_context.peer = 0;
  FileDescriptor socket;
  try {
    socket =
        connect_with_retry(master, 0, deadline, "rank 0's rendezvous (MASTER_ADDR:MASTER_PORT)",
                           options.timeout, peer_context);
  } catch (const TimeoutError& e) {
    throw TimeoutError("rank 0 never arrived: " + e.message(), e.context());
  }

  const RendezvousHello hello{kRendezvousMagic, kTcpProtocolVersion,      world_size, rank,
                              job_hash,         PeerAddress::of(own_data)};
  const Deadline answer_deadline(options.timeout + kRendezvousAnswerGrace);
  RendezvousTable header;
  IoResult io = offer_hello(socket.get(), hello, handshake_security(options, "rendezvous"),
                            deadline, "rank 0's rendezvous at " + master.to_string(), peer_context);
  if (io.status == IoStatus::kDone) {
    io = recv_exact(socket.get(), writable_bytes_of_value(header), answer_deadline);
  }
  if (io.status == IoStatus::kTimedOut) {
    throw TimeoutError("rank 0 sent no address table within " + format_seconds(options.timeout) +
                           " (COLTRAIN_TIMEOUT) of this rank's "
                           "arrival at the rendezvous at " +
                           master.to_string(),
                       peer_context);
  }
  if (io.status == IoStatus::kClosed) {
    throw PeerLostError("rank 0 closed the rendezvous connection at " + master.to_string() +
                            " before sending the address table (" + io.reason +
                            "): it failed, or it turned this rank away (see its log: another "
                            "WORLD_SIZE, COLTRAIN_JOB_ID or secret, or two processes with RANK=" +
                            std::to_string(rank) + ")",
                        peer_context);
  }
  if (header.magic != kRendezvousMagic || header.version != kTcpProtocolVersion ||
      header.world_size != world_size) {
    throw MismatchError("the process at the rendezvous address " + master.to_string() +
                            " answered with something other than this job's address table (not "
                            "coltrain, another protocol version, or another WORLD_SIZE)",
                        peer_context);
  }

  AddressTable table{header.nonce, std::vector<PeerAddress>(static_cast<std::size_t>(world_size))};
  io = recv_exact(socket.get(), std::as_writable_bytes(std::span(table.entries)), answer_deadline);
  if (io.status != IoStatus::kDone) {
    throw PeerLostError("rank 0 broke off the address table (" +
                            (io.reason.empty() ? std::string("timed out") : io.reason) + ")",
                        peer_context);
  }
  if (header.status == TableStatus::kRanksMissing) {
    std::vector<int> missing;
    for (std::size_t r = 1; r < table.entries.size(); ++r) {
      if (table.entries[r].port == 0) missing.push_back(static_cast<int>(r));
    }
    throw TimeoutError(
        never_arrived_message(missing, master, options.timeout) + " (reported by rank 0)", context);
  }
  return table;
}

// A mesh connection's proofs bind the acceptor's rank and the generation's nonce.
inline HandshakeSecurity mesh_security(const CommOptions& options, int acceptor,
                                       std::uint64_t nonce) {
  return handshake_security(options, "mesh", {acceptor, nonce});
}

// Connects every pair of ranks; returns the sockets indexed by peer rank (empty at this rank).
inline std::vector<FileDescriptor> connect_full_mesh(
    int rank, int world_size, const AddressTable& table, const FileDescriptor& data_listener,
    std::uint64_t job_hash, const CommOptions& options, const Logger& logger,
    const ErrorContext& context) {
  std::vector<FileDescriptor> peers(static_cast<std::size_t>(world_size));
  const Deadline deadline(options.timeout);
  const MeshHello hello{kMeshMagic, kTcpProtocolVersion, world_size, rank, job_hash, table.nonce};
  // Lower ranks first: a connect completes in the listener's backlog, before the peer accepts it,
  // so no rank waits for another to reach its accept loop.
  for (int peer = 0; peer < rank; ++peer) {
    ErrorContext peer_context = context;
    peer_context.peer = peer;
    const PeerAddress& entry = table.entries[static_cast<std::size_t>(peer)];
    FileDescriptor socket = connect_with_retry(entry.endpoint(), kSocketBufferBytes, deadline,
                                               "rank " + std::to_string(peer) + "'s data listener",
                                               options.timeout, peer_context);
    const std::string acceptor = "rank " + std::to_string(peer) + "'s data listener";
    const IoResult sent =
        offer_hello(socket.get(), hello, mesh_security(options, peer, table.nonce), deadline,
                    acceptor + " at " + entry.endpoint().to_string(), peer_context);
    if (sent.status == IoStatus::kTimedOut) {
      throw TimeoutError("rank " + std::to_string(peer) + " took no handshake within " +
                             format_seconds(options.timeout) + " (COLTRAIN_TIMEOUT)",
                         peer_context);
    }
    if (sent.status == IoStatus::kClosed) {
      throw PeerLostError("rank " + std::to_string(peer) +
                              " closed its data connection during the handshake (" + sent.reason +
                              ")",
                          peer_context);
    }
    peers[static_cast<std::size_t>(peer)] = std::move(socket);
  }
  if (rank == world_size - 1) return peers;

  const Endpoint listening = local_endpoint(data_listener.get());
  const auto judge = [&](const MeshHello& hello) {
    return judge_mesh_hello(hello, rank + 1, world_size, job_hash, table.nonce);
  };
  auto arrivals = collect_handshakes<MeshHello>(data_listener.get(), rank + 1, world_size, deadline,
                                                judge, mesh_security(options, rank, table.nonce),
                                                "the data listener at " + listening.to_string(),
                                                logger, context);
  const std::vector<int> missing = missing_ranks(arrivals, rank + 1);
  if (!missing.empty()) {
    throw TimeoutError(describe_ranks(missing) +
                           " never connected to this rank's data listener at " +
                           listening.to_string() + " within " + format_seconds(options.timeout) +
                           " (COLTRAIN_TIMEOUT); " + (missing.size() == 1 ? "it" : "they") +
                           " received the address table, then failed or stalled",
                       context);
  }
  for (int peer = rank + 1; peer < world_size; ++peer) {
    FileDescriptor& socket = arrivals[static_cast<std::size_t>(peer)].socket;
    set_no_delay(socket.get(), context);
    peers[static_cast<std::size_t>(peer)] = std::move(socket);
  }
  return peers;
}

// Runs the whole bootstrap for this process's rank (see the top of this header). Returns one
// connected, non-blocking socket per peer, indexed by rank; the entry for this rank is empty.
inline std::vector<FileDescriptor> bootstrap_tcp_mesh(const LaunchEnv& env,
                                                      const CommOptions& options,
                                                      const Logger& logger) {
  ErrorContext context;
  context.rank = env.rank;
  context.operation = "TCP rendezvous";
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    throw InvalidArgument("rank " + std::to_string(env.rank) + " is outside a world of " +
                              std::to_string(env.world_size) + " ranks",
                          context);
  }
  if (env.world_size == 1) return std::vector<FileDescriptor>(1);

  if (env.master_port == 0 && options.port_file.empty()) {
    throw ConfigError(
        "MASTER_PORT=0 asks rank 0 to listen on a port the kernel picks, which the other ranks "
        "can only learn from COLTRAIN_PORT_FILE: set it to one path all ranks can read",
        context);
  }
  const Stopwatch elapsed;
  const Deadline deadline(options.timeout);
  const std::uint64_t job_hash = hash_job_id(options.job_id);
  Endpoint master;
  FileDescriptor data_listener, rendezvous_listener;
  // Everything up to rank 0's listening door; a rank 0 that fails here tells the others through
  // the port file (and only here: a failure later, after the port was published and withdrawn,
  // would leave a stale line behind for the next job that uses the same file).
  try {
    ensure_descriptor_limit(env.world_size - 1, context);
    ensure_memory_limit(env.world_size - 1, context);
    master = {resolve_address(env.master_addr, "MASTER_ADDR", context),
              static_cast<std::uint16_t>(env.master_port)};
    const IpAddress data_address = data_address_for(env.master_addr, master, options, context);
    check_door_security(data_address, options, logger, context);
    data_listener = listen_tcp({data_address, 0}, kSocketBufferBytes,
                               "data connections from the other ranks", context);
    if (env.rank == 0) {
      rendezvous_listener = open_rendezvous(env.master_addr, master, options, logger, context);
    }
  } catch (const Error& e) {
    if (env.rank == 0 && !options.port_file.empty()) {
      publish_rendezvous_failure(options.port_file, job_hash, e.message(), context);
    }
    throw;
  }
  const Endpoint own_data = local_endpoint(data_listener.get());
  AddressTable table;
  if (env.rank == 0) {
    if (!options.port_file.empty()) publish_port(options.port_file, job_hash, master.port, context);
    table = serve_rendezvous(std::move(rendezvous_listener), master, own_data, env.world_size,
                             job_hash, options, deadline, logger, context);
  } else {
    if (!options.port_file.empty()) {
      master.port = static_cast<std::uint16_t>(
          await_published_port(options.port_file, job_hash, deadline, options.timeout, context));
    }
    table = join_rendezvous(master, own_data, env.rank, env.world_size, job_hash, options, deadline,
                            context);
  }
  std::vector<FileDescriptor> peers = connect_full_mesh(
      env.rank, env.world_size, table, data_listener, job_hash, options, logger, context);
  logger.info("TCP mesh of ", env.world_size, " ranks ready in ", elapsed.seconds() * 1e3,
              " ms; this rank's data listener was ", own_data.to_string());
  return peers;
}

}  // namespace coltrain::comm::detail
