// tcp_over_store(). Header-only builds include this file at the end of
// comm/rendezvous/store_rendezvous.hpp; with COLTRAIN_SEPARATE_COMPILATION only <coltrain/src.hpp>
// includes it.
#pragma once

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/rendezvous/descriptor_limit.hpp>
#include <coltrain/comm/rendezvous/memory_limit.hpp>
#include <coltrain/comm/rendezvous/store_rendezvous.hpp>
#include <coltrain/comm/rendezvous/tcp_handshake.hpp>
#include <coltrain/comm/rendezvous/tcp_rendezvous.hpp>
#include <coltrain/comm/transport/tcp/socket.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/log.hpp>
#include <coltrain/core/timer.hpp>

#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::comm {
namespace detail {

inline constexpr const char* kStoreNonceKey = "coltrain/nonce";

inline std::string store_address_key(int rank) {
  return "coltrain/address/" + std::to_string(rank);
}

template <class T>
std::span<const std::byte> bytes_of(const T& value) {
  static_assert(std::has_unique_object_representations_v<T>);
  return std::as_bytes(std::span<const T, 1>(&value, 1));
}

// `key`'s value read back as a T; a value of another size is not one of ours.
template <class T>
T read_store_value(RendezvousStore& store, const std::string& key, const ErrorContext& context) {
  const std::vector<std::byte> value = store.get(key);
  if (value.size() != sizeof(T)) {
    throw ConfigError("the rendezvous store's \"" + key + "\" holds " +
                          std::to_string(value.size()) + " bytes, not the " +
                          std::to_string(sizeof(T)) +
                          " coltrain writes there: another program (or another coltrain "
                          "version) uses the same keys; give this communicator a store prefix "
                          "of its own",
                      context);
  }
  T result;
  std::memcpy(&result, value.data(), sizeof(T));
  return result;
}

// The address this rank's data listener announces (see the top of store_rendezvous.hpp).
inline IpAddress store_data_address(const LaunchEnv& env, const CommOptions& options,
                                    const ErrorContext& context) {
  if (!options.socket_ifname.empty() || nonempty_env("MASTER_ADDR")) {
    const Endpoint master{resolve_address(env.master_addr, "MASTER_ADDR", context),
                          static_cast<std::uint16_t>(env.master_port)};
    return data_address_for(env.master_addr, master, options, context);
  }
  return outward_address(AF_INET).value_or(IpAddress::ipv4(htonl(INADDR_LOOPBACK)));
}

}  // namespace detail

COLTRAIN_DECL Communicator tcp_over_store(RendezvousStore& store, int rank, int size,
                                          CommOptions options) {
  ErrorContext context;
  context.rank = rank;
  context.operation = "TCP rendezvous through a store";
  if (size < 1 || rank < 0 || rank >= size) {
    throw InvalidArgument("rank " + std::to_string(rank) + " is outside a world of " +
                              std::to_string(size) + " ranks",
                          context);
  }
  // The launcher's view of this host (ranks per host sizes the spin before sleeping), with the
  // group's own rank and size. The store gave those, so a launcher environment that is incomplete
  // (PyTorch's test harness sets WORLD_SIZE alone) only loses that hint.
  LaunchEnv env;
  try {
    env = detect_launch_env();
  } catch (const Error&) {
    env.local_world_size.reset();
    if (const char* master = detail::nonempty_env("MASTER_ADDR")) env.master_addr = master;
  }
  env.rank = rank;
  env.world_size = size;
  if (env.local_world_size) env.local_world_size = std::min(*env.local_world_size, size);
  env.local_rank = std::min(env.local_rank, size - 1);
  const Logger logger(rank, size);
  if (size == 1) {
    return Communicator::tcp(rank, std::vector<detail::FileDescriptor>(1), env, options);
  }

  const Stopwatch elapsed;
  detail::ensure_descriptor_limit(size - 1, context);
  detail::ensure_memory_limit(size - 1, context);
  const detail::IpAddress address = detail::store_data_address(env, options, context);
  detail::check_door_security(address, options, logger, context);
  const detail::FileDescriptor listener = detail::listen_tcp(
      {address, 0}, detail::kSocketBufferBytes, "data connections from the other ranks", context);
  const detail::Endpoint own = detail::local_endpoint(listener.get());

  if (rank == 0) {
    const std::uint64_t nonce = detail::make_nonce();
    store.set(detail::kStoreNonceKey, detail::bytes_of(nonce));
  }
  store.set(detail::store_address_key(rank), detail::bytes_of(detail::PeerAddress::of(own)));
  detail::AddressTable table;
  table.nonce = detail::read_store_value<std::uint64_t>(store, detail::kStoreNonceKey, context);
  table.entries.reserve(static_cast<std::size_t>(size));
  for (int peer = 0; peer < size; ++peer) {
    table.entries.push_back(detail::read_store_value<detail::PeerAddress>(
        store, detail::store_address_key(peer), context));
  }
  std::vector<detail::FileDescriptor> peers = detail::connect_full_mesh(
      rank, size, table, listener, detail::hash_job_id(options.job_id), options, logger, context);
  logger.info("TCP mesh of ", size, " ranks ready through the store in ", elapsed.seconds() * 1e3,
              " ms; this rank's data listener was ", own.to_string());
  return Communicator::tcp(rank, std::move(peers), env, options);
}

}  // namespace coltrain::comm
