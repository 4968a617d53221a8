#include "ingest/decode_pool.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

namespace patchstore {
namespace {

// Pipe messages: u32 length + bytes.
bool WriteAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool SendMessage(int fd, const std::string& m) {
  uint32_t n = static_cast<uint32_t>(m.size());
  return WriteAll(fd, &n, 4) && WriteAll(fd, m.data(), m.size());
}

// Reads exactly n bytes, waiting at most until `deadline` (steady clock, ms);
// returns 1 ok, 0 EOF or error, -1 timeout.
int ReadAll(int fd, void* data, size_t n, std::chrono::steady_clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                            std::chrono::steady_clock::now());
    if (left.count() <= 0) return -1;
    pollfd pfd{fd, POLLIN, 0};
    int pr = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) return 0;
    if (pr == 0) continue;
    ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return 1;
}

int ReceiveMessage(int fd, std::string* m, std::chrono::steady_clock::time_point deadline) {
  uint32_t n = 0;
  int rc = ReadAll(fd, &n, 4, deadline);
  if (rc != 1) return rc;
  if (n > (64u << 20)) return 0;
  m->resize(n);
  return ReadAll(fd, m->data(), n, deadline);
}

// Blocking read for the child.
bool ReceiveBlocking(int fd, std::string* m) {
  return ReceiveMessage(fd, m, std::chrono::steady_clock::now() + std::chrono::hours(24 * 365)) == 1;
}

void PutU64(std::string* s, uint64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }
uint64_t GetU64(const std::string& s, size_t* pos) {
  uint64_t v = 0;
  if (*pos + 8 <= s.size()) std::memcpy(&v, s.data() + *pos, 8);
  *pos += 8;
  return v;
}
void PutStr(std::string* s, const std::string& v) {
  PutU64(s, v.size());
  s->append(v);
}
std::string GetStr(const std::string& s, size_t* pos) {
  uint64_t n = GetU64(s, pos);
  if (*pos + n > s.size()) return {};
  std::string v = s.substr(*pos, n);
  *pos += n;
  return v;
}

[[noreturn]] void ChildMain(int in, int out, uint8_t* shared, size_t shared_size, uint64_t max_pixels,
                            uint64_t memory_limit, const DecodeJob& job) {
  // Die with the parent; never touch the parent's LMDB state.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  signal(SIGINT, SIG_IGN);  // Ctrl-C is the parent's to handle
  // Libraries print their own warnings (libpng: "PNG input buffer is
  // incomplete"); the error that matters comes back as a Status naming the
  // file, so keep the terminal clean.
  int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (devnull >= 0) {
    ::dup2(devnull, 2);
    ::close(devnull);
  }
  struct rlimit lim;
  if (::getrlimit(RLIMIT_DATA, &lim) == 0) {
    // RLIMIT_DATA counts private writable memory; add the budget to what the
    // child inherited so the limit bounds new allocations only.
    uint64_t now = 0;
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line))
      if (line.rfind("VmData:", 0) == 0) now = std::strtoull(line.c_str() + 7, nullptr, 10) * 1024;
    const uint64_t want = now + memory_limit;
    if (lim.rlim_max == RLIM_INFINITY || want < lim.rlim_max) {
      lim.rlim_cur = want;
      ::setrlimit(RLIMIT_DATA, &lim);
    }
  }
  std::string req;
  while (ReceiveBlocking(in, &req)) {
    if (job) {
      if (!SendMessage(out, job(req, shared, shared_size))) break;
      continue;
    }
    size_t pos = 0;
    const std::string path = GetStr(req, &pos), channel = GetStr(req, &pos);
    std::string resp;
    Result<DecodedImage> img = Status::Internal("not decoded");
    try {
      img = DecodeFile(path, channel, max_pixels);
    } catch (const std::bad_alloc&) {
      img = Status::InvalidArgument("decoding '" + path + "': out of memory (decoder limit " +
                                    std::to_string(memory_limit >> 20) + " MiB)");
    } catch (const std::exception& e) {
      img = Status::Corruption("decoding '" + path + "': " + e.what());
    }
    if (!img.ok()) {
      PutU64(&resp, static_cast<uint64_t>(img.status().code()));
      PutStr(&resp, img.status().message());
    } else {
      const cv::Mat& m = img->pixels;
      const size_t bytes = m.total() * m.elemSize();
      if (bytes > shared_size) {
        PutU64(&resp, static_cast<uint64_t>(Code::kInvalidArgument));
        PutStr(&resp, "decoding '" + path + "': decoded image larger than the limit");
      } else {
        std::memcpy(shared, m.data, bytes);  // m is continuous (DecodeFile guarantees it)
        PutU64(&resp, 0);
        PutU64(&resp, static_cast<uint64_t>(m.rows));
        PutU64(&resp, static_cast<uint64_t>(m.cols));
        PutU64(&resp, static_cast<uint64_t>(m.type()));
        PutU64(&resp, static_cast<uint64_t>(img->source_type));
        PutStr(&resp, img->format);
        PutStr(&resp, img->channel_names);
        PutU64(&resp, img->warnings.size());
        for (const std::string& w : img->warnings) PutStr(&resp, w);
      }
    }
    if (!SendMessage(out, resp)) break;
  }
  _exit(0);
}

}  // namespace

Result<std::unique_ptr<DecodePool>> DecodePool::Start(const DecodePoolOptions& o) {
  auto pool = std::unique_ptr<DecodePool>(new DecodePool());
  pool->options_ = o;
  if (pool->options_.memory_limit == 0) pool->options_.memory_limit = o.max_pixels * 16 + (uint64_t{1} << 30);
  pool->slots_.resize(static_cast<size_t>(std::max(1, o.slots)));
  for (Slot& s : pool->slots_) {
    s.shared_size = static_cast<size_t>(o.shared_bytes ? o.shared_bytes : o.max_pixels * 4);
    void* p = ::mmap(nullptr, s.shared_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return Status::FromErrno("reserving decoder memory", errno);
    s.shared = static_cast<uint8_t*>(p);
    PS_RETURN_IF_ERROR(pool->Spawn(&s));
  }
  return pool;
}

Status DecodePool::Spawn(Slot* s) {
  int a[2], b[2];
  if (::pipe2(a, O_CLOEXEC) != 0) return Status::FromErrno("creating a decoder pipe", errno);
  if (::pipe2(b, O_CLOEXEC) != 0) {
    ::close(a[0]);
    ::close(a[1]);
    return Status::FromErrno("creating a decoder pipe", errno);
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : {a[0], a[1], b[0], b[1]}) ::close(fd);
    return Status::FromErrno("starting a decoder process", errno);
  }
  if (pid == 0) {
    ::close(a[1]);
    ::close(b[0]);
    ChildMain(a[0], b[1], s->shared, s->shared_size, options_.max_pixels, options_.memory_limit, options_.job);
  }
  ::close(a[0]);
  ::close(b[1]);
  s->pid = pid;
  s->to_child = a[1];
  s->from_child = b[0];
  return Status::OK();
}

void DecodePool::Kill(Slot* s) {
  if (s->pid > 0) {
    ::kill(s->pid, SIGKILL);
    ::waitpid(s->pid, nullptr, 0);
  }
  if (s->to_child >= 0) ::close(s->to_child);
  if (s->from_child >= 0) ::close(s->from_child);
  s->pid = -1;
  s->to_child = s->from_child = -1;
}

DecodePool::~DecodePool() {
  for (Slot& s : slots_) {
    if (s.to_child >= 0) ::close(s.to_child);  // EOF: the child exits
    s.to_child = -1;
    if (s.pid > 0) {
      // Give it a moment to exit on its own, then make sure.
      for (int i = 0; i < 50 && ::waitpid(s.pid, nullptr, WNOHANG) == 0; ++i) ::usleep(2000);
      ::kill(s.pid, SIGKILL);
      ::waitpid(s.pid, nullptr, 0);
    }
    if (s.from_child >= 0) ::close(s.from_child);
    if (s.shared) ::munmap(s.shared, s.shared_size);
  }
}

Result<std::string> DecodePool::Exchange(Slot* sp, const std::string& req, const std::string& what) {
  Slot& s = *sp;
  if (s.pid < 0) PS_RETURN_IF_ERROR(Spawn(&s));
  if (!SendMessage(s.to_child, req)) {
    Kill(&s);
    return Status::Internal("decoding '" + what + "': the decoder process is gone");
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000));
  std::string resp;
  int rc = ReceiveMessage(s.from_child, &resp, deadline);
  if (rc != 1) {
    std::string why;
    if (rc < 0) {
      Kill(&s);
      why = "gave up after " + std::to_string(static_cast<int>(options_.timeout_s)) + " s (decoder timeout)";
    } else {
      int status = 0;
      ::waitpid(s.pid, &status, 0);
      s.pid = -1;
      Kill(&s);
      if (WIFSIGNALED(status)) why = std::string("the decoder crashed (") + strsignal(WTERMSIG(status)) + ")";
      else why = "the decoder exited unexpectedly";
    }
    return Status::Corruption("decoding '" + what + "': " + why);
  }
  return resp;
}

Result<std::string> DecodePool::Call(int slot, const std::string& request, const std::string& what) {
  if (!options_.job) return Status::Internal("DecodePool::Call on a pool without a job");
  return Exchange(&slots_[static_cast<size_t>(slot)], request, what);
}

Result<DecodedImage> DecodePool::Decode(int slot_index, const std::string& path, const std::string& channel) {
  Slot& s = slots_[static_cast<size_t>(slot_index)];
  std::string req;
  PutStr(&req, path);
  PutStr(&req, channel);
  PS_ASSIGN_OR_RETURN(const std::string resp, Exchange(&s, req, path));
  size_t pos = 0;
  const auto code = static_cast<Code>(GetU64(resp, &pos));
  if (code != Code::kOk) return Status(code, GetStr(resp, &pos));
  DecodedImage img;
  const int rows = static_cast<int>(GetU64(resp, &pos));
  const int cols = static_cast<int>(GetU64(resp, &pos));
  const int type = static_cast<int>(GetU64(resp, &pos));
  img.source_type = static_cast<SourceType>(GetU64(resp, &pos));
  img.format = GetStr(resp, &pos);
  img.channel_names = GetStr(resp, &pos);
  const uint64_t nwarn = GetU64(resp, &pos);
  for (uint64_t i = 0; i < nwarn && i < 100; ++i) img.warnings.push_back(GetStr(resp, &pos));
  const int64_t elem = static_cast<int64_t>(CV_ELEM_SIZE(type));
  if (rows <= 0 || cols <= 0 || elem <= 0 || static_cast<uint64_t>(rows) * cols * elem > s.shared_size)
    return Status::Internal("decoding '" + path + "': the decoder returned an impossible size");
  img.pixels = cv::Mat(rows, cols, type, s.shared);  // borrowed: valid until the next Decode on this slot
  return img;
}

}  // namespace patchstore
