// A userspace network link for tests, where the kernel has no sch_netem:
// joins two or more interfaces like a hub, passing every frame that arrives
// on one to all the others after a fixed delay, dropping each with a given
// probability. Runs until SIGTERM/SIGINT.
//
//   link_emulator [--delay-ms D] [--loss P] [--seed S] IFACE IFACE [IFACE...]
//
// Raw AF_PACKET sockets, promiscuous, with PACKET_VNET_HDR: a veth hands
// over TCP segments the kernel has not yet split (GSO) or checksummed, and
// the virtio-net header that comes with each frame lets the other side do
// both. Frames this program sent (PACKET_OUTGOING) are not forwarded again.
// Prints "link_emulator: forwarding" on stdout once every socket is open,
// and the frames it forwarded and dropped on stderr when it stops.
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

namespace {

volatile sig_atomic_t stop = 0;
void OnSignal(int) { stop = 1; }

int64_t NowNs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// A frame, virtio-net header first, due out of one port at `due_ns`.
struct Pending {
  int64_t due_ns;
  std::vector<char> frame;
};

struct Port {
  std::string name;
  int fd = -1;
  // FIFO: one fixed delay keeps due times in arrival order.
  std::deque<Pending> out;
};

// Opens a promiscuous raw socket bound to `name`; -1 (with the reason on
// stderr) on failure.
int OpenPort(const std::string& name) {
  const unsigned index = if_nametoindex(name.c_str());
  if (index == 0) {
    std::fprintf(stderr, "link_emulator: no interface %s\n", name.c_str());
    return -1;
  }
  const int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
  if (fd < 0) {
    std::perror("link_emulator: socket(AF_PACKET)");
    return -1;
  }
  const int one = 1;
  if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof(one)) != 0) {
    std::perror("link_emulator: PACKET_VNET_HDR");
    return -1;
  }
  sockaddr_ll addr{};
  addr.sll_family = AF_PACKET;
  addr.sll_protocol = htons(ETH_P_ALL);
  addr.sll_ifindex = static_cast<int>(index);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("link_emulator: bind");
    return -1;
  }
  packet_mreq mreq{};
  mreq.mr_ifindex = static_cast<int>(index);
  mreq.mr_type = PACKET_MR_PROMISC;
  if (setsockopt(fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mreq, sizeof(mreq)) !=
      0) {
    std::perror("link_emulator: PACKET_MR_PROMISC");
    return -1;
  }
  return fd;
}

int Usage() {
  std::fprintf(stderr,
               "usage: link_emulator [--delay-ms D] [--loss P] [--seed S] "
               "IFACE IFACE [IFACE...]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  double delay_ms = 0, loss = 0;
  uint64_t seed = 1;
  std::vector<Port> ports;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--delay-ms" || a == "--loss" || a == "--seed") && i + 1 < argc) {
      const char* v = argv[++i];
      if (a == "--delay-ms") delay_ms = std::atof(v);
      if (a == "--loss") loss = std::atof(v);
      if (a == "--seed") seed = std::strtoull(v, nullptr, 10);
    } else if (!a.empty() && a[0] != '-') {
      ports.push_back(Port{a, -1, {}});
    } else {
      return Usage();
    }
  }
  if (ports.size() < 2 || delay_ms < 0 || loss < 0 || loss > 1) return Usage();
  for (Port& p : ports) {
    p.fd = OpenPort(p.name);
    if (p.fd < 0) return 1;
  }
  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);
  std::mt19937_64 random(seed);
  std::uniform_real_distribution<double> uniform(0, 1);
  const int64_t delay_ns = static_cast<int64_t>(delay_ms * 1e6);
  std::printf(
      "link_emulator: forwarding between %zu ports, delay %g ms, "
      "loss %g, seed %llu\n",
      ports.size(), delay_ms, loss, static_cast<unsigned long long>(seed));
  std::fflush(stdout);

  // A GSO frame is up to 64 KiB; room for a larger gso_max_size too.
  std::vector<char> buffer(1 << 18);
  std::vector<pollfd> fds(ports.size());
  uint64_t forwarded = 0, dropped = 0;
  while (!stop) {
    int64_t next_due = -1;
    for (const Port& p : ports) {
      if (!p.out.empty() && (next_due < 0 || p.out.front().due_ns < next_due)) {
        next_due = p.out.front().due_ns;
      }
    }
    timespec wait{1, 0};
    if (next_due >= 0) {
      const int64_t ns = std::max<int64_t>(0, next_due - NowNs());
      wait = {static_cast<time_t>(ns / 1000000000), ns % 1000000000};
    }
    for (size_t i = 0; i < ports.size(); ++i) fds[i] = {ports[i].fd, POLLIN, 0};
    if (ppoll(fds.data(), fds.size(), &wait, nullptr) < 0 && errno != EINTR) {
      std::perror("link_emulator: ppoll");
      return 1;
    }
    for (size_t i = 0; i < ports.size(); ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      // Drain what is queued, so one busy port does not starve the others
      // of their due times for long.
      for (int k = 0; k < 64; ++k) {
        sockaddr_ll from{};
        socklen_t len = sizeof(from);
        const ssize_t n =
            recvfrom(ports[i].fd, buffer.data(), buffer.size(), MSG_DONTWAIT,
                     reinterpret_cast<sockaddr*>(&from), &len);
        if (n <= 0) break;
        if (from.sll_pkttype == PACKET_OUTGOING) continue;
        if (loss > 0 && uniform(random) < loss) {
          ++dropped;
          continue;
        }
        const int64_t due = NowNs() + delay_ns;
        for (size_t j = 0; j < ports.size(); ++j) {
          if (j == i) continue;
          ports[j].out.push_back(Pending{
              due, std::vector<char>(buffer.data(), buffer.data() + n)});
        }
        ++forwarded;
      }
    }
    const int64_t now = NowNs();
    for (Port& p : ports) {
      while (!p.out.empty() && p.out.front().due_ns <= now) {
        // A port that is down (a partition) refuses the frame: it is lost,
        // as on a cut cable.
        send(p.fd, p.out.front().frame.data(), p.out.front().frame.size(), 0);
        p.out.pop_front();
      }
    }
  }
  std::fprintf(stderr,
               "link_emulator: stopped, %llu frames forwarded, %llu dropped\n",
               static_cast<unsigned long long>(forwarded),
               static_cast<unsigned long long>(dropped));
  return 0;
}
