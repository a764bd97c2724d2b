#pragma once
// The thin layer between the TCP transport and the POSIX socket API: IPv4 and IPv6 endpoints, and
// the few socket operations bootstrap and transport need, each turning a failed system call into a
// coltrain exception that says what was attempted, with whom, and why it failed.
//
// Every socket is created non-blocking and close-on-exec: bootstrap waits with poll() against a
// Deadline, and the transport's progress engine never blocks in a read or write. Writes pass
// MSG_NOSIGNAL, so a vanished peer is an EPIPE error here instead of a process-wide SIGPIPE.

#include <coltrain/comm/transport/tcp/file_descriptor.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/timer.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

namespace coltrain::comm::detail {

// Socket buffers for data connections: a ring step of 1 MB chunks keeps several chunks in flight,
// and fewer buffer-full stalls mean fewer sleeps. Linux caps the request at net.core.[rw]mem_max.
inline constexpr int kSocketBufferBytes = 4 << 20;

inline std::string errno_text(int error) { return std::generic_category().message(error); }

[[noreturn]] inline void throw_system_error(const std::string& what, int error,
                                            ErrorContext context) {
  throw CommError(what + ": " + errno_text(error), std::move(context));
}

// "1 s", "0.25 s", "300 s": a timeout as users wrote it in COLTRAIN_TIMEOUT.
inline std::string format_seconds(Clock::duration duration) {
  std::ostringstream out;
  out << std::chrono::duration<double>(duration).count() << " s";
  return out.str();
}

// Milliseconds until `deadline` for poll(), rounded up so a wait never ends just short of it.
inline int poll_timeout_ms(const Deadline& deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline.remaining()).count();
  return static_cast<int>(std::min<long long>(left, 1 << 30));
}

// An IPv4 or IPv6 address in network byte order (IPv4 in the first 4 bytes), with the interface
// index that an IPv6 link-local address needs to be usable.
struct IpAddress {
  std::uint16_t family = AF_INET;
  std::array<std::uint8_t, 16> bytes{};
  std::uint32_t scope = 0;

  static IpAddress ipv4(std::uint32_t network_order) {
    IpAddress address;
    std::memcpy(address.bytes.data(), &network_order, 4);
    return address;
  }
  // 0.0.0.0 or ::, every address of this host.
  static IpAddress any(std::uint16_t family) {
    IpAddress address;
    address.family = family;
    return address;
  }
  // Only AF_INET and AF_INET6 come here.
  static IpAddress from_sockaddr(const sockaddr* socket_address) {
    IpAddress address;
    address.family = socket_address->sa_family;
    if (address.family == AF_INET6) {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(socket_address);
      std::memcpy(address.bytes.data(), &v6->sin6_addr, 16);
      address.scope = v6->sin6_scope_id;
    } else {
      std::memcpy(address.bytes.data(),
                  &reinterpret_cast<const sockaddr_in*>(socket_address)->sin_addr, 4);
    }
    return address;
  }

  bool is_v6() const { return family == AF_INET6; }
  // 127/8, ::1, and IPv4-mapped 127/8.
  bool is_loopback() const {
    if (!is_v6()) return bytes[0] == 127;
    static constexpr std::array<std::uint8_t, 16> kLoopback{0, 0, 0, 0, 0, 0, 0, 0,
                                                            0, 0, 0, 0, 0, 0, 0, 1};
    static constexpr std::array<std::uint8_t, 12> kMapped{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return bytes == kLoopback ||
           (std::equal(kMapped.begin(), kMapped.end(), bytes.begin()) && bytes[12] == 127);
  }
  bool is_link_local() const { return is_v6() && bytes[0] == 0xfe && (bytes[1] & 0xc0) == 0x80; }
  bool is_unspecified() const {
    return std::all_of(bytes.begin(), bytes.begin() + (is_v6() ? 16 : 4),
                       [](std::uint8_t b) { return b == 0; });
  }

  // "10.0.0.1", "fd00::2", "fe80::1%3"
  std::string text() const {
    char text[INET6_ADDRSTRLEN] = {};
    ::inet_ntop(family, bytes.data(), text, sizeof text);
    return scope != 0 ? std::string(text) + "%" + std::to_string(scope) : std::string(text);
  }

  bool operator==(const IpAddress&) const = default;
};

// An address and a port.
struct Endpoint {
  IpAddress address;
  std::uint16_t port = 0;

  // Fills `out`; returns the length that bind() and connect() take.
  socklen_t to_sockaddr(sockaddr_storage& out) const {
    out = {};
    if (address.is_v6()) {
      auto& v6 = reinterpret_cast<sockaddr_in6&>(out);
      v6.sin6_family = AF_INET6;
      std::memcpy(&v6.sin6_addr, address.bytes.data(), 16);
      v6.sin6_scope_id = address.scope;
      v6.sin6_port = htons(port);
      return sizeof v6;
    }
    auto& v4 = reinterpret_cast<sockaddr_in&>(out);
    v4.sin_family = AF_INET;
    std::memcpy(&v4.sin_addr, address.bytes.data(), 4);
    v4.sin_port = htons(port);
    return sizeof v4;
  }

  static Endpoint from_sockaddr(const sockaddr_storage& socket_address) {
    const auto* generic = reinterpret_cast<const sockaddr*>(&socket_address);
    const std::uint16_t port = generic->sa_family == AF_INET6
                                   ? reinterpret_cast<const sockaddr_in6*>(generic)->sin6_port
                                   : reinterpret_cast<const sockaddr_in*>(generic)->sin_port;
    return {IpAddress::from_sockaddr(generic), ntohs(port)};
  }

  // "a.b.c.d:port" or "[v6]:port"
  std::string to_string() const {
    return (address.is_v6() ? "[" + address.text() + "]" : address.text()) + ":" +
           std::to_string(port);
  }

  bool operator==(const Endpoint&) const = default;
};

// MASTER_ADDR as users write it: a name, a dotted quad, an IPv6 address, or one in brackets.
inline std::string strip_brackets(const std::string& host) {
  return host.size() > 2 && host.front() == '[' && host.back() == ']'
             ? host.substr(1, host.size() - 2)
             : host;
}

// The address of `host`: IPv4 when the name has one (the same choice on every host, whatever
// order the resolver prefers), else IPv6. ConfigError names `variable`, where the user set it,
// when the name does not resolve.
inline IpAddress resolve_address(const std::string& host, std::string_view variable,
                                 const ErrorContext& context) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(strip_brackets(host).c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    const std::string reason = rc == EAI_SYSTEM ? errno_text(errno) : ::gai_strerror(rc);
    throw ConfigError("cannot resolve " + std::string(variable) + "=" + host + ": " + reason,
                      context);
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, &::freeaddrinfo);
  const addrinfo* chosen = nullptr;
  for (const addrinfo* entry = found; entry != nullptr; entry = entry->ai_next) {
    if (entry->ai_family == AF_INET) {
      chosen = entry;
      break;
    }
    if (entry->ai_family == AF_INET6 && chosen == nullptr) chosen = entry;
  }
  if (chosen == nullptr) {
    throw ConfigError(
        "cannot resolve " + std::string(variable) + "=" + host + " to an IPv4 or IPv6 address",
        context);
  }
  return IpAddress::from_sockaddr(chosen->ai_addr);
}

// Runs `visit(name, address, flags)` for every IPv4 and IPv6 address of this host's interfaces.
template <class Visit>
void for_each_interface_address(const Visit& visit, const ErrorContext& context) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    throw_system_error("list the network interfaces (getifaddrs)", errno, context);
  }
  const std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> owner(list, &::freeifaddrs);
  for (const ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr ||
        (entry->ifa_addr->sa_family != AF_INET && entry->ifa_addr->sa_family != AF_INET6)) {
      continue;
    }
    visit(std::string_view(entry->ifa_name), IpAddress::from_sockaddr(entry->ifa_addr),
          entry->ifa_flags);
  }
}

// Which of two addresses of one interface to announce: the family MASTER_ADDR has, then IPv6
// addresses that are not link-local.
inline bool better_interface_address(const IpAddress& candidate, const IpAddress& current,
                                     std::uint16_t family) {
  auto rank = [&](const IpAddress& a) { return (a.family == family ? 2 : 0) + !a.is_link_local(); };
  return rank(candidate) > rank(current);
}

// The address of the network interface `name` (COLTRAIN_SOCKET_IFNAME), preferably of `family`.
// The ConfigError for a missing interface lists the ones this host has, so the fix is one look
// away.
inline IpAddress interface_address(const std::string& name, std::uint16_t family,
                                   const ErrorContext& context) {
  std::optional<IpAddress> chosen;
  std::string available;
  for_each_interface_address(
      [&](std::string_view interface, IpAddress address, unsigned) {
        if (interface == name) {
          if (address.is_link_local()) address.scope = ::if_nametoindex(name.c_str());
          if (!chosen || better_interface_address(address, *chosen, family)) chosen = address;
          return;
        }
        available += available.empty() ? "" : ", ";
        available += std::string(interface) + " (" + address.text() + ")";
      },
      context);
  if (chosen) return *chosen;
  throw ConfigError("COLTRAIN_SOCKET_IFNAME=" + name + ": this host has no interface '" + name +
                        "' with an IPv4 or IPv6 address; interfaces with one: " +
                        (available.empty() ? "none" : available),
                    context);
}

inline FileDescriptor make_tcp_socket(std::uint16_t family, const ErrorContext& context) {
  const int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_system_error("create a TCP socket", errno, context);
  return FileDescriptor(fd);
}

inline void set_int_option(int fd, int level, int option, int value, const char* name,
                           const ErrorContext& context) {
  if (::setsockopt(fd, level, option, &value, sizeof value) != 0) {
    throw_system_error(std::string("set socket option ") + name, errno, context);
  }
}

// Small messages go out at once instead of waiting for Nagle's algorithm to batch them.
inline void set_no_delay(int fd, const ErrorContext& context) {
  set_int_option(fd, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY", context);
}

// Must precede connect() or listen(): the window scale is agreed in the handshake.
inline void set_buffer_sizes(int fd, int bytes, const ErrorContext& context) {
  set_int_option(fd, SOL_SOCKET, SO_SNDBUF, bytes, "SO_SNDBUF", context);
  set_int_option(fd, SOL_SOCKET, SO_RCVBUF, bytes, "SO_RCVBUF", context);
}

inline Endpoint local_endpoint(int fd) {
  sockaddr_storage socket_address{};
  socklen_t length = sizeof socket_address;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&socket_address), &length) != 0) return {};
  return Endpoint::from_sockaddr(socket_address);
}

// The remote end of a connection as "a.b.c.d:port" or "[v6]:port", for messages.
inline std::string peer_name(int fd) {
  sockaddr_storage socket_address{};
  socklen_t length = sizeof socket_address;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&socket_address), &length) != 0) {
    return "an unknown address";
  }
  return Endpoint::from_sockaddr(socket_address).to_string();
}

// The local address this host sends from to reach `remote`, found by connecting a UDP socket, which
// consults the routing table without sending anything. Empty when no route leads there.
inline std::optional<IpAddress> route_source(const Endpoint& remote) {
  const int fd = ::socket(remote.address.family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  const FileDescriptor owner(fd);
  sockaddr_storage to{};
  const socklen_t length = remote.to_sockaddr(to);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), length) != 0) return std::nullopt;
  return local_endpoint(fd).address;
}

inline IpAddress route_source_address(const Endpoint& remote, const ErrorContext& context) {
  if (std::optional<IpAddress> source = route_source(remote)) return *source;
  throw_system_error("find the local address that reaches " + remote.to_string(), errno, context);
}

// Whether MASTER_ADDR, as written, keeps a job on this host: "localhost", a 127.x literal, or ::1.
// A name that merely resolves to loopback here does not: Debian's /etc/hosts maps the machine's own
// name to 127.0.1.1, while other hosts resolve it to the machine's real address.
inline bool names_loopback_only(const std::string& host) {
  const std::string bare = strip_brackets(host);
  in_addr v4{};
  in6_addr v6{};
  if (bare == "localhost") return true;
  if (::inet_pton(AF_INET, bare.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  return ::inet_pton(AF_INET6, bare.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

// An address of `family` that other hosts can reach: the one this host's default route sends from
// (asked of the routing table for a documentation address; nothing is sent), else the first
// address of an interface that is up and not loopback (IPv6: not link-local). Empty when there is
// none.
inline std::optional<IpAddress> outward_address(std::uint16_t family) {
  Endpoint documentation{IpAddress::ipv4(htonl(0xC6336401u)), 9};  // 198.51.100.1
  if (family == AF_INET6) {
    documentation.address = IpAddress::any(AF_INET6);
    documentation.address.bytes = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  }
  if (const std::optional<IpAddress> source = route_source(documentation);
      source && !source->is_loopback() && !source->is_unspecified()) {
    return source;
  }
  std::optional<IpAddress> found;
  try {
    for_each_interface_address(
        [&](std::string_view, const IpAddress& address, unsigned flags) {
          if (!found && address.family == family && (flags & IFF_UP) != 0 &&
              !address.is_loopback() && !address.is_link_local()) {
            found = address;
          }
        },
        {});
  } catch (const CommError&) {
    return std::nullopt;  // no interface list: the caller keeps its loopback address
  }
  return found;
}

// Why a bind to port 0 or a connect found no local port, and what cures it: every port of the
// kernel's ephemeral range is taken (each connection holds one per destination, a listener on port
// 0 one of its own, and closed connections keep theirs in TIME_WAIT for a minute).
inline std::string out_of_local_ports() {
  std::ifstream file("/proc/sys/net/ipv4/ip_local_port_range");
  long low = 0;
  long high = 0;
  std::string range = "net.ipv4.ip_local_port_range";
  if (file >> low >> high && high >= low) {
    range += " = " + std::to_string(low) + "-" + std::to_string(high) + ", " +
             std::to_string(high - low + 1) + " ports";
  }
  return "this host has no local port left (" + range +
         ", taken by open connections and those in TIME_WAIT): widen the range (sysctl -w "
         "net.ipv4.ip_local_port_range=\"1024 65535\" keeps clear of well-known ports), or run "
         "fewer ranks a host";
}

// A listening socket on `at` (port 0: an ephemeral port; read it back with local_endpoint).
// SO_REUSEADDR lets a new job bind the port while the last job's connections sit in TIME_WAIT.
// `buffer_bytes` (if nonzero) is inherited by the accepted connections.
inline FileDescriptor listen_tcp(const Endpoint& at, int buffer_bytes, std::string_view purpose,
                                 const ErrorContext& context) {
  FileDescriptor socket = make_tcp_socket(at.address.family, context);
  set_int_option(socket.get(), SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR", context);
  if (buffer_bytes > 0) set_buffer_sizes(socket.get(), buffer_bytes, context);
  sockaddr_storage address{};
  const socklen_t length = at.to_sockaddr(address);
  if (::bind(socket.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    const int error = errno;
    const std::string what = "listen on " + at.to_string() + " for " + std::string(purpose);
    if (error == EADDRNOTAVAIL) {
      throw ConfigError(what + ": " + at.address.text() + " is not an address of this host",
                        context);
    }
    if (error == EADDRINUSE && at.port == 0)
      throw CommError(what + ": " + out_of_local_ports(), context);
    if (error == EADDRINUSE) {
      throw CommError(
          what + ": " + errno_text(error) + " (another job, or another program, holds this port)",
          context);
    }
    throw_system_error(what, error, context);
  }
  if (::listen(socket.get(), SOMAXCONN) != 0) {
    throw_system_error("listen on " + at.to_string() + " for " + std::string(purpose), errno,
                       context);
  }
  return socket;
}

// The next pending connection on `listener` (non-blocking), or an empty descriptor when there is
// none. Connections that died in the accept queue are skipped.
inline FileDescriptor accept_connection(int listener, const ErrorContext& context) {
  while (true) {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) return FileDescriptor(fd);
    const int error = errno;
    if (error == EAGAIN || error == EWOULDBLOCK) return {};
    if (error == EINTR || error == ECONNABORTED || error == EPROTO) continue;
    throw_system_error("accept a connection", error, context);
  }
}

// Failures a later attempt can cure: the listener is not up yet, or the network is catching up.
inline bool is_transient_connect_error(int error) {
  switch (error) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case ETIMEDOUT:
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ENETDOWN:
    case EADDRNOTAVAIL:  // out of ephemeral ports, for now
    case EAGAIN:
    case EINTR:
      return true;
    default:
      return false;
  }
}

// One non-blocking connect, waited for until `deadline`. Returns 0 or the errno of the failure.
inline int try_connect(int fd, const Endpoint& to, const Deadline& deadline) {
  sockaddr_storage address{};
  const socklen_t address_length = to.to_sockaddr(address);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), address_length) == 0) return 0;
  if (errno != EINPROGRESS) return errno;
  pollfd entry{fd, POLLOUT, 0};
  const int ready = ::poll(&entry, 1, poll_timeout_ms(deadline));
  if (ready < 0) return errno;
  if (ready == 0) return ETIMEDOUT;
  int error = 0;
  socklen_t length = sizeof error;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) return errno;
  return error;
}

// Connects to `to`, retrying transient failures with a growing pause until `deadline`, so that
// ranks may start in any order. `buffer_bytes` (if nonzero) sizes the socket buffers before the
// handshake. Throws TimeoutError, "could not connect to <target> ...", when the deadline passes.
inline FileDescriptor connect_with_retry(const Endpoint& to, int buffer_bytes,
                                         const Deadline& deadline, std::string_view target,
                                         Clock::duration timeout, const ErrorContext& context) {
  using namespace std::chrono_literals;
  constexpr auto kFirstPause = 1ms;
  constexpr auto kLongestPause = 100ms;
  auto pause = std::chrono::duration_cast<Clock::duration>(kFirstPause);
  int last_error = 0;
  while (true) {
    FileDescriptor socket = make_tcp_socket(to.address.family, context);
    set_no_delay(socket.get(), context);
    if (buffer_bytes > 0) set_buffer_sizes(socket.get(), buffer_bytes, context);
    last_error = try_connect(socket.get(), to, deadline);
    if (last_error == 0) return socket;
    if (!is_transient_connect_error(last_error)) {
      throw_system_error("connect to " + std::string(target) + " at " + to.to_string(), last_error,
                         context);
    }
    if (deadline.expired()) break;
    std::this_thread::sleep_for(std::min(pause, deadline.remaining()));
    pause = std::min<Clock::duration>(pause * 2, kLongestPause);
  }
  std::string why = errno_text(last_error);
  if (last_error == EADDRNOTAVAIL) why += ": " + out_of_local_ports();
  throw TimeoutError("could not connect to " + std::string(target) + " at " + to.to_string() +
                         " within " + format_seconds(timeout) +
                         " (COLTRAIN_TIMEOUT); last error: " + why,
                     context);
}

enum class IoStatus { kDone, kClosed, kTimedOut };

// The outcome of moving a whole buffer: kClosed carries the reason (EOF, reset...).
struct IoResult {
  IoStatus status = IoStatus::kDone;
  std::string reason;
};

// Writes all of `bytes` to a non-blocking socket, waiting in poll() until `deadline`.
inline IoResult send_exact(int fd, std::span<const std::byte> bytes, const Deadline& deadline) {
  while (!bytes.empty()) {
    const ssize_t sent = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (sent > 0) {
      bytes = bytes.subspan(static_cast<std::size_t>(sent));
      continue;
    }
    const int error = errno;
    if (error == EINTR) continue;
    if (error != EAGAIN && error != EWOULDBLOCK) return {IoStatus::kClosed, errno_text(error)};
    pollfd entry{fd, POLLOUT, 0};
    if (deadline.expired() || ::poll(&entry, 1, poll_timeout_ms(deadline)) == 0) {
      return {IoStatus::kTimedOut, {}};
    }
  }
  return {};
}

// Reads all of `bytes` from a non-blocking socket, waiting in poll() until `deadline`.
inline IoResult recv_exact(int fd, std::span<std::byte> bytes, const Deadline& deadline) {
  while (!bytes.empty()) {
    const ssize_t received = ::recv(fd, bytes.data(), bytes.size(), 0);
    if (received > 0) {
      bytes = bytes.subspan(static_cast<std::size_t>(received));
      continue;
    }
    if (received == 0) return {IoStatus::kClosed, "peer closed the connection"};
    const int error = errno;
    if (error == EINTR) continue;
    if (error != EAGAIN && error != EWOULDBLOCK) return {IoStatus::kClosed, errno_text(error)};
    pollfd entry{fd, POLLIN, 0};
    if (deadline.expired() || ::poll(&entry, 1, poll_timeout_ms(deadline)) == 0) {
      return {IoStatus::kTimedOut, {}};
    }
  }
  return {};
}

}  // namespace coltrain::comm::detail
