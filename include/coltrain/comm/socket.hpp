#pragma once
// The thin layer between the TCP transport and the POSIX socket API: an owning file descriptor,
// IPv4 endpoints, and the few socket operations bootstrap and transport need, each turning a failed
// system call into a coltrain exception that says what was attempted, with whom, and why it failed.
//
// Every socket is created non-blocking and close-on-exec: bootstrap waits with poll() against a
// Deadline, and the transport's progress engine never blocks in a read or write. Writes pass
// MSG_NOSIGNAL, so a vanished peer is an EPIPE error here instead of a process-wide SIGPIPE.

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
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
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

// Owns one file descriptor; closes it on destruction.
class FileDescriptor {
 public:
  FileDescriptor() noexcept = default;
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }

  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// An IPv4 address and port. The address is kept in network byte order, as the socket API uses it.
struct Ipv4Endpoint {
  std::uint32_t address = 0;
  std::uint16_t port = 0;

  sockaddr_in to_sockaddr() const {
    sockaddr_in result{};
    result.sin_family = AF_INET;
    result.sin_addr.s_addr = address;
    result.sin_port = htons(port);
    return result;
  }

  static Ipv4Endpoint from_sockaddr(const sockaddr_in& socket_address) {
    return {socket_address.sin_addr.s_addr, ntohs(socket_address.sin_port)};
  }

  std::string address_text() const {
    char text[INET_ADDRSTRLEN] = {};
    in_addr raw{};
    raw.s_addr = address;
    ::inet_ntop(AF_INET, &raw, text, sizeof text);
    return text;
  }

  // "a.b.c.d:port"
  std::string to_string() const { return address_text() + ":" + std::to_string(port); }

  bool operator==(const Ipv4Endpoint&) const = default;
};

// The IPv4 address of `host` (a name or a dotted quad). ConfigError names `variable`, where the
// user set it, when the name does not resolve.
inline std::uint32_t resolve_ipv4(const std::string& host, std::string_view variable,
                                  const ErrorContext& context) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    const std::string reason = rc == EAI_SYSTEM ? errno_text(errno) : ::gai_strerror(rc);
    throw ConfigError(
        "cannot resolve " + std::string(variable) + "=" + host + " to an IPv4 address: " + reason,
        context);
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, &::freeaddrinfo);
  return reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr.s_addr;
}

// The IPv4 address of the network interface `name` (COLTRAIN_SOCKET_IFNAME). The ConfigError for a
// missing interface lists the ones this host has, so the fix is one look away.
inline std::uint32_t interface_ipv4(const std::string& name, const ErrorContext& context) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    throw_system_error("list the network interfaces (getifaddrs)", errno, context);
  }
  const std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> owner(list, &::freeifaddrs);
  std::string available;
  for (const ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    const auto* socket_address = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr);
    if (name == entry->ifa_name) return socket_address->sin_addr.s_addr;
    available += available.empty() ? "" : ", ";
    available += std::string(entry->ifa_name) + " (" +
                 Ipv4Endpoint{socket_address->sin_addr.s_addr, 0}.address_text() + ")";
  }
  throw ConfigError("COLTRAIN_SOCKET_IFNAME=" + name + ": this host has no interface '" + name +
                        "' with an IPv4 address; interfaces with one: " +
                        (available.empty() ? "none" : available),
                    context);
}

inline FileDescriptor make_tcp_socket(const ErrorContext& context) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
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

inline Ipv4Endpoint local_endpoint(int fd) {
  sockaddr_in socket_address{};
  socklen_t length = sizeof socket_address;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&socket_address), &length) != 0) return {};
  return Ipv4Endpoint::from_sockaddr(socket_address);
}

// The remote end of a connection as "a.b.c.d:port", for messages.
inline std::string peer_name(int fd) {
  sockaddr_in socket_address{};
  socklen_t length = sizeof socket_address;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&socket_address), &length) != 0) {
    return "an unknown address";
  }
  return Ipv4Endpoint::from_sockaddr(socket_address).to_string();
}

// The local address this host sends from to reach `remote`, found by connecting a UDP socket, which
// consults the routing table without sending anything.
inline std::uint32_t route_source_address(const Ipv4Endpoint& remote, const ErrorContext& context) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_system_error("create a UDP socket", errno, context);
  const FileDescriptor owner(fd);
  const sockaddr_in to = remote.to_sockaddr();
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) {
    throw_system_error("find the local address that reaches " + remote.to_string(), errno, context);
  }
  return local_endpoint(fd).address;
}

inline bool is_loopback(std::uint32_t address) { return (ntohl(address) >> 24) == 127; }

// Whether MASTER_ADDR, as written, keeps a job on this host: "localhost" or a 127.x literal. A name
// that merely resolves to loopback here does not: Debian's /etc/hosts maps the machine's own name
// to 127.0.1.1, while other hosts resolve it to the machine's real address.
inline bool names_loopback_only(const std::string& host) {
  in_addr literal{};
  return host == "localhost" ||
         (::inet_pton(AF_INET, host.c_str(), &literal) == 1 && is_loopback(literal.s_addr));
}

// An address of this host that other hosts can reach: the one its default route sends from (found
// by connecting a UDP socket to a documentation address, which sends nothing), else the first
// non-loopback IPv4 address of an interface that is up; 0 when there is none.
inline std::uint32_t outward_address() {
  if (const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0); fd >= 0) {
    const FileDescriptor owner(fd);
    const sockaddr_in anywhere = Ipv4Endpoint{htonl(0xC6336401u), 9}.to_sockaddr();  // 198.51.100.1
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&anywhere), sizeof anywhere) == 0) {
      sockaddr_in local{};
      socklen_t length = sizeof local;
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
          !is_loopback(local.sin_addr.s_addr) && local.sin_addr.s_addr != 0) {
        return local.sin_addr.s_addr;
      }
    }
  }
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return 0;
  const std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> owner(list, &::freeifaddrs);
  for (const ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET ||
        (entry->ifa_flags & IFF_UP) == 0) {
      continue;
    }
    const std::uint32_t address =
        reinterpret_cast<const sockaddr_in*>(entry->ifa_addr)->sin_addr.s_addr;
    if (!is_loopback(address)) return address;
  }
  return 0;
}

// A listening socket on `at` (port 0: an ephemeral port; read it back with local_endpoint).
// SO_REUSEADDR lets a new job bind the port while the last job's connections sit in TIME_WAIT.
// `buffer_bytes` (if nonzero) is inherited by the accepted connections.
inline FileDescriptor listen_ipv4(const Ipv4Endpoint& at, int buffer_bytes,
                                  std::string_view purpose, const ErrorContext& context) {
  FileDescriptor socket = make_tcp_socket(context);
  set_int_option(socket.get(), SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR", context);
  if (buffer_bytes > 0) set_buffer_sizes(socket.get(), buffer_bytes, context);
  const sockaddr_in address = at.to_sockaddr();
  if (::bind(socket.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    const int error = errno;
    const std::string what = "listen on " + at.to_string() + " for " + std::string(purpose);
    if (error == EADDRNOTAVAIL) {
      throw ConfigError(what + ": " + at.address_text() + " is not an address of this host",
                        context);
    }
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
inline int try_connect(int fd, const Ipv4Endpoint& to, const Deadline& deadline) {
  const sockaddr_in address = to.to_sockaddr();
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) return 0;
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
inline FileDescriptor connect_with_retry(const Ipv4Endpoint& to, int buffer_bytes,
                                         const Deadline& deadline, std::string_view target,
                                         Clock::duration timeout, const ErrorContext& context) {
  using namespace std::chrono_literals;
  constexpr auto kFirstPause = 1ms;
  constexpr auto kLongestPause = 100ms;
  auto pause = std::chrono::duration_cast<Clock::duration>(kFirstPause);
  int last_error = 0;
  while (true) {
    FileDescriptor socket = make_tcp_socket(context);
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
  throw TimeoutError("could not connect to " + std::string(target) + " at " + to.to_string() +
                         " within " + format_seconds(timeout) +
                         " (COLTRAIN_TIMEOUT); last error: " + errno_text(last_error),
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
