// The adapter's CUDA-IPC descriptor server (shareIpcHandle / getIpcDevPtr) against a hostile
// local peer, through the stand-in fake_torch.cpp on cudaemu: a silent connection (same user, and
// user nobody) does not stop an import that follows; a handle whose export id is edited to another
// live export is refused; a process of uid 65534 holding a valid handle string gets no block, even
// with the socket's directory opened up; the socket name holds no part of any token; a malformed
// XSEG_TORCH_IPC_ALLOW_UIDS is refused naming it.
// With `--allowed` (run with XSEG_TORCH_IPC_ALLOW_UIDS=65534), that process imports the block, and
// a flood of silent connections from it does not make this process's own imports fail.
#include <dlfcn.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include <c10/cuda/CUDAFunctions.h>

#include "devmem.h"
#include "driver.h"
#include "xseg.h"

namespace {
const char FD_PREFIX[] = "xseg-ipc-fd:";
constexpr int BOUND_S = 60; // an import that takes longer than this is stalled (generous, load)

struct Parsed {
    std::string name, id, token;
};

// "xseg-ipc-fd:NAME:ID:TOKEN" (NAME may itself hold ':').
bool parse(const std::string &h, Parsed *p)
{
    if (h.compare(0, sizeof FD_PREFIX - 1, FD_PREFIX) != 0)
        return false;
    size_t b = h.rfind(':');
    size_t a = b == std::string::npos || b == 0 ? std::string::npos : h.rfind(':', b - 1);
    if (a == std::string::npos || a < sizeof FD_PREFIX - 1)
        return false;
    p->name = h.substr(sizeof FD_PREFIX - 1, a - (sizeof FD_PREFIX - 1));
    p->id = h.substr(a + 1, b - a - 1);
    p->token = h.substr(b + 1);
    return true;
}

// A connection to the server named in a handle (a path, or an abstract name as older adapters
// used); -1 when it cannot be made.
int connect_to(const std::string &name)
{
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    bool abstract = name.empty() || name[0] != '/';
    size_t n = std::min(name.size(), sizeof a.sun_path - 2);
    std::memcpy(a.sun_path + (abstract ? 1 : 0), name.data(), n);
    socklen_t len = (socklen_t)(offsetof(sockaddr_un, sun_path) + n + 1);
    if (::connect(fd, reinterpret_cast<sockaddr *>(&a), len) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

// getIpcDevPtr(@p h) must return (a block whose last byte of 4096 is @p byte) within BOUND_S;
// a stalled import cannot be cancelled, so the driver stops there.
void import_bounded(Pluggable *a, const std::string &h, unsigned char byte, const char *what)
{
    auto fut = std::async(std::launch::async, [a, h, byte] {
        std::shared_ptr<void> p = a->getIpcDevPtr(h);
        return p && dev_byte(static_cast<unsigned char *>(p.get()) + 4095) == byte;
    });
    if (fut.wait_for(std::chrono::seconds(BOUND_S)) != std::future_status::ready) {
        std::fprintf(stderr, "FAIL %s: getIpcDevPtr did not return within %d s\n", what, BOUND_S);
        std::fflush(stderr);
        std::_Exit(1);
    }
    try {
        EXPECT(fut.get(), "%s: the import does not see the exporter's bytes", what);
        std::printf("ok   %s: getIpcDevPtr still answers\n", what);
    } catch (const c10::Error &e) {
        EXPECT(false, "%s: getIpcDevPtr raised: %s", what, e.what());
    }
}

// Drop to uid/gid 65534 (in a child); false when that is refused.
bool drop_to_nobody() { return ::setgroups(0, nullptr) == 0 && ::setgid(65534) == 0 && ::setuid(65534) == 0; }

// Copy @p from to a new file @p to of mode 0755. false on any failure.
bool copy_file(const char *from, const std::string &to)
{
    int in = ::open(from, O_RDONLY | O_CLOEXEC);
    int out = in < 0 ? -1 : ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    bool ok = out >= 0;
    char buf[1 << 16];
    for (ssize_t r; ok && (r = ::read(in, buf, sizeof buf)) != 0;) {
        if (r < 0 && errno == EINTR)
            continue;
        ok = r > 0 && ::write(out, buf, (size_t)r) == r;
    }
    if (in >= 0)
        ::close(in);
    if (out >= 0)
        ok = ::close(out) == 0 && ok;
    return ok && ::chmod(to.c_str(), 0755) == 0;
}

// This driver, libxseg, the stand-in libtorch, the adapter and the emulated driver copied into a
// 0755 folder under /tmp, made once:
// the build tree may sit below a folder uid 65534 cannot enter (a CI clone in a 0700 mkdtemp),
// and the second user must still run the same code. Empty when a copy fails.
const std::string &nobody_stage()
{
    static std::string stage, made;
    static bool tried = false;
    static pid_t owner = 0;
    if (tried)
        return stage;
    tried = true;
    char dir[] = "/tmp/xseg-ipc-nobody-XXXXXX";
    Dl_info xi {}, ti {};
    const char *cuda = std::getenv("XSEG_LIBCUDA"), *adapter = std::getenv("XSEG_TORCH_ADAPTER");
    if (!::mkdtemp(dir))
        return stage;
    made = dir;
    owner = ::getpid();
    std::atexit([] { // only the process that made it (a forked child leaves it be)
        if (::getpid() != owner)
            return;
        for (const char *f : {"/driver", "/libxseg.so.0", "/libcuda.so", "/libfake_torch.so", "/adapter.so"})
            (void)::unlink((made + f).c_str());
        (void)::rmdir(made.c_str());
    });
    if (!::chmod(dir, 0755) && ::dladdr((void *)&xseg_malloc, &xi) && xi.dli_fname &&
        ::dladdr(reinterpret_cast<void *>(&c10::cuda::current_device), &ti) && ti.dli_fname && adapter &&
        copy_file("/proc/self/exe", made + "/driver") && copy_file(xi.dli_fname, made + "/libxseg.so.0") &&
        copy_file(ti.dli_fname, made + "/libfake_torch.so") && copy_file(adapter, made + "/adapter.so") &&
        (!cuda || copy_file(cuda, made + "/libcuda.so")))
        stage = made;
    else
        std::fprintf(stderr, "FAIL cannot stage a copy of the driver for uid 65534 in %s: %s\n", dir,
                     std::strerror(errno));
    return stage;
}

// Run this driver as `--import HANDLE BYTE` in a new process of uid/gid 65534 (a fresh process:
// CUDA state does not survive fork). @return its exit status (import_main's codes), 100 when it
// could not drop or exec, -1 when it did not end within BOUND_S (killed).
int nobody_imports(const std::string &h, unsigned char byte)
{
    const std::string &stage = nobody_stage();
    if (stage.empty())
        return 100;
    std::string self = stage + "/driver", b = std::to_string(byte);
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (std::getenv("XSEG_LIBCUDA"))
            ::setenv("XSEG_LIBCUDA", (stage + "/libcuda.so").c_str(), 1);
        ::setenv("XSEG_TORCH_ADAPTER", (stage + "/adapter.so").c_str(), 1);
        ::setenv("LD_LIBRARY_PATH", stage.c_str(), 1);
        if (drop_to_nobody())
            ::execl(self.c_str(), self.c_str(), "--import", h.c_str(), b.c_str(), (char *)nullptr);
        std::_Exit(100);
    }
    for (int i = 0; i < BOUND_S * 10; i++) {
        int status = 0;
        if (::waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return -1;
}

// `--import HANDLE BYTE`: getIpcDevPtr(HANDLE). Exit 0: refused by the exporter (the message
// names its socket or says it sent nothing); 2: the block was mapped and holds BYTE; 3: another
// error or other bytes.
int import_main(const char *h, const char *byte)
{
    Pluggable *a = install_adapter();
    if (!a)
        return 3;
    a->init(1);
    try {
        std::shared_ptr<void> p = a->getIpcDevPtr(h);
        std::fprintf(stderr, "     uid %d mapped the block at %p\n", (int)::getuid(), p.get());
        return p && dev_byte(static_cast<unsigned char *>(p.get()) + 4095) == std::atoi(byte) ? 2 : 3;
    } catch (const c10::Error &e) {
        std::fprintf(stderr, "     uid %d: %s\n", (int)::getuid(), e.what());
        return contains(e.what(), "exporting process") ? 0 : 3;
    }
}
// A child of uid 65534 connects to @p name and stays silent while getIpcDevPtr(@p h) runs here.
// @return whether that child could connect.
bool silent_nobody_then_import(Pluggable *a, const std::string &name, const std::string &h, unsigned char byte)
{
    int ready[2];
    if (::pipe(ready) != 0) {
        EXPECT(false, "pipe: %s", std::strerror(errno));
        return false;
    }
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid == 0) {
        ::close(ready[0]);
        char c = drop_to_nobody() && connect_to(name) >= 0 ? 'c' : 'n';
        (void)!::write(ready[1], &c, 1);
        ::pause(); // the connection stays open until the parent kills this child
        std::_Exit(0);
    }
    ::close(ready[1]);
    char c = 0;
    pollfd pf{ready[0], POLLIN, 0};
    if (pid > 0 && ::poll(&pf, 1, BOUND_S * 1000) == 1)
        (void)!::read(ready[0], &c, 1);
    ::close(ready[0]);
    std::printf("     uid 65534 %s\n", c == 'c' ? "connected and stays silent" : "cannot connect");
    import_bounded(a, h, byte, "a silent connection of uid 65534 open");
    if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
    }
    return c == 'c';
}

// An admitted uid 65534 (a child) floods the server with non-blocking connections that never send,
// holding at most FLOOD_HELD, while this process imports @p h FLOOD_IMPORTS times, FLOOD_GAP_MS
// apart: every import must succeed (the server bounds pending connections per uid, and never drops
// the owner's for another uid's). @return the connections the flood made, or -1 when it could not
// start.
constexpr int FLOOD_HELD = 400, FLOOD_IMPORTS = 200, FLOOD_GAP_MS = 20;
long flood_then_imports(Pluggable *a, const std::string &name, const std::string &h)
{
    int ctl[2], rep[2];
    if (::pipe(ctl) != 0 || ::pipe(rep) != 0) {
        EXPECT(false, "pipe: %s", std::strerror(errno));
        return -1;
    }
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid == 0) {
        ::close(ctl[1]);
        ::close(rep[0]);
        long made = 0;
        if (!drop_to_nobody()) {
            (void)!::write(rep[1], &made, sizeof made);
            std::_Exit(1);
        }
        (void)::fcntl(ctl[0], F_SETFL, O_NONBLOCK);
        (void)!::write(rep[1], &made, sizeof made); // started
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::memcpy(addr.sun_path, name.data(), std::min(name.size(), sizeof addr.sun_path - 1));
        std::vector<int> held(FLOOD_HELD, -1);
        size_t next = 0;
        for (long i = 0;; i++) {
            char c;
            if (i % 64 == 0 && ::read(ctl[0], &c, 1) != -1)
                break; // the parent is done (a byte, or its end closed)
            int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (fd < 0)
                continue;
            if (::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0 && errno != EAGAIN &&
                errno != EINPROGRESS) {
                ::close(fd);
                continue;
            }
            made++;
            if (held[next] >= 0)
                ::close(held[next]);
            held[next] = fd;
            next = (next + 1) % held.size();
        }
        (void)!::write(rep[1], &made, sizeof made);
        std::_Exit(0);
    }
    ::close(ctl[0]);
    ::close(rep[1]);
    long made = -1;
    pollfd pf{rep[0], POLLIN, 0};
    bool started = pid > 0 && ::poll(&pf, 1, BOUND_S * 1000) == 1 && ::read(rep[0], &made, sizeof made) == sizeof made;
    int ok = 0;
    std::string first_error;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; started && i < FLOOD_IMPORTS; i++) {
        std::this_thread::sleep_for(std::chrono::milliseconds(FLOOD_GAP_MS));
        try {
            std::shared_ptr<void> p = a->getIpcDevPtr(h); // mapped, then unmapped when p goes
            ok += p != nullptr;
        } catch (const c10::Error &e) {
            if (first_error.empty())
                first_error = e.what();
        }
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(BOUND_S)) {
            EXPECT(false, "the imports beside the flood took over %d s (%d done)", BOUND_S, i + 1);
            break;
        }
    }
    (void)!::write(ctl[1], "x", 1);
    ::close(ctl[1]);
    made = -1;
    if (started && ::poll(&pf, 1, BOUND_S * 1000) == 1)
        (void)!::read(rep[0], &made, sizeof made);
    ::close(rep[0]);
    if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
    }
    EXPECT(started, "the flooding child of uid 65534 did not start");
    EXPECT(ok == FLOOD_IMPORTS, "%d of %d imports failed beside a flood of uid 65534 (%ld connections); the first: %s",
           FLOOD_IMPORTS - ok, FLOOD_IMPORTS, made, first_error.c_str());
    std::printf("%s  %d of %d imports %d ms apart beside uid 65534's flood of %ld silent connections (at most %d "
                "held)\n", ok == FLOOD_IMPORTS ? "ok " : "FAIL", ok, FLOOD_IMPORTS, FLOOD_GAP_MS, made, FLOOD_HELD);
    return made;
}

// A stand-in exporter at a socket of its own that answers one import with @p reply (its bytes,
// then closes without reading: "" closes at once after reading the request). @return the
// message getIpcDevPtr raised ("" when it returned).
std::string import_from_stand_in(Pluggable *a, const std::string &reply, bool read_first)
{
    char dir[] = "/tmp/xseg-ipc-stand-in-XXXXXX";
    if (!::mkdtemp(dir))
        return "mkdtemp failed";
    std::string path = std::string(dir) + "/socket";
    int l = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    if (l < 0 || ::bind(l, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0 || ::listen(l, 4) != 0)
        return "stand-in socket failed";
    std::thread server([l, reply, read_first] {
        int c = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0)
            return;
        char req[40];
        if (read_first)
            for (size_t got = 0; got < sizeof req;) {
                ssize_t r = ::read(c, req + got, sizeof req - got);
                if (r <= 0)
                    break;
                got += (size_t)r;
            }
        if (!reply.empty())
            (void)!::write(c, reply.data(), reply.size());
        ::close(c);
    });
    std::string msg;
    try {
        (void)a->getIpcDevPtr(FD_PREFIX + path + ":1:" + std::string(32, 'a'));
    } catch (const c10::Error &e) {
        msg = e.what();
    }
    server.join();
    ::close(l);
    (void)::unlink(path.c_str());
    (void)::rmdir(dir);
    return msg;
}
// --free-at-exit: an exported block freed by a static destructor that runs after the adapter's
// own statics are gone, as PyTorch's CUDA-IPC limbo (a static of libtorch_cuda, loaded before the
// adapter) frees the blocks it still holds at exit. On the H200 (2026-11-27) torch_checks.py died
// there with "corrupted size vs. prev_size in fastbins" (exit 134) after its torch.multiprocessing
// item: the free looked the block up in the adapter's export table after that table's destructor
// ran. This holder is constructed before main, so it is destroyed after the adapter's statics.
struct ExitHolder {
    Pluggable *a = nullptr;
    void *block = nullptr;
    ~ExitHolder()
    {
        if (!block)
            return;
        a->raw_delete(block); // the adapter's deleter: its export is closed, then xseg frees it
        xseg_device_stats st;
        bool freed = xseg_get_stats(0, &st) == XSEG_SUCCESS && st.allocated_bytes[XSEG_STAT_ALL].current == 0;
        std::printf("%s  an exported block freed by a static destructor after the adapter's statics\n",
                    freed ? "ok " : "FAIL");
        std::fflush(stdout);
        if (!freed)
            ::_exit(1);
    }
} exit_holder;

int free_at_exit_main()
{
    Pluggable *a = install_adapter();
    if (!a)
        return 1;
    a->init(1);
    void *b = alloc_on(a, 2 * MiB, 0, nullptr);
    std::string h = a->shareIpcHandle(b).handle;
    Parsed p;
    if (!parse(h, &p)) {
        a->raw_delete(b);
        std::printf("SKIP the block is not shared as file descriptors here: %s\n", h.c_str());
        return 77;
    }
    exit_holder.a = a;
    exit_holder.block = b; // freed at exit, by ~ExitHolder
    return 0;
}
} // namespace

int main(int argc, char **argv)
{
    if (argc == 4 && std::strcmp(argv[1], "--import") == 0)
        return import_main(argv[2], argv[3]);
    if (argc == 2 && std::strcmp(argv[1], "--free-at-exit") == 0)
        return free_at_exit_main();
    bool allowed = argc > 1 && std::strcmp(argv[1], "--allowed") == 0;
    ::signal(SIGPIPE, SIG_IGN);
    Pluggable *a = install_adapter();
    if (!a)
        return 1;
    a->init(1);
    cudaStream_t s0 = nullptr;
    void *b1 = alloc_on(a, 2 * MiB, 0, s0), *b2 = alloc_on(a, 2 * MiB, 0, s0);
    EXPECT(dev_set(b1, 0x11, 4096) && dev_set(b2, 0x22, 4096), "cuMemsetD8 of the blocks");
    if (!allowed) { // a malformed opt-in is refused, naming it, and nothing is served
        ::setenv("XSEG_TORCH_IPC_ALLOW_UIDS", "65534,nobody", 1);
        try {
            std::string h = a->shareIpcHandle(b1).handle;
            EXPECT(!contains(h, "xseg-ipc-fd:"), "XSEG_TORCH_IPC_ALLOW_UIDS=65534,nobody was accepted: %s", h.c_str());
        } catch (const c10::Error &e) {
            EXPECT(contains(e.what(), "XSEG_TORCH_IPC_ALLOW_UIDS='65534,nobody'"), "message: %s", e.what());
            std::printf("ok   a malformed XSEG_TORCH_IPC_ALLOW_UIDS is refused: %s\n", e.what());
        }
        ::unsetenv("XSEG_TORCH_IPC_ALLOW_UIDS");
    }
    std::string h1 = a->shareIpcHandle(b1).handle, h2 = a->shareIpcHandle(b2).handle;
    Parsed p1, p2;
    if (!parse(h1, &p1) || !parse(h2, &p2)) {
        std::printf("SKIP the blocks are not shared as file descriptors here: %s\n", h1.c_str());
        return 77;
    }

    if (allowed) { // XSEG_TORCH_IPC_ALLOW_UIDS=65534: that uid is admitted
        if (::geteuid() != 0) {
            std::printf("SKIP not root: cannot run a process of uid 65534\n");
            return 77;
        }
        int st = nobody_imports(h1, 0x11);
        EXPECT(st == 2, "an admitted uid 65534 did not map the block (exit %d)", st);
        EXPECT(silent_nobody_then_import(a, p1.name, h1, 0x11), "an admitted uid 65534 cannot connect");
        long made = flood_then_imports(a, p1.name, h1);
        EXPECT(made > FLOOD_HELD, "the flood of uid 65534 made %ld connections (more than %d expected)", made,
               FLOOD_HELD);
        a->raw_delete(b1);
        a->raw_delete(b2);
        if (failures)
            return 1;
        std::printf("ok   XSEG_TORCH_IPC_ALLOW_UIDS admits uid 65534\n");
        return 0;
    }

    // ---- the socket name holds no part of a token; every export has its own ----
    EXPECT(p1.token != p2.token, "two exports share the token %s", p1.token.c_str());
    for (const Parsed *p : {&p1, &p2})
        for (size_t i = 0; i + 8 <= p->token.size(); i++)
            EXPECT(p->name.find(p->token.substr(i, 8)) == std::string::npos,
                   "the socket name '%s' holds '%s' of the token %s", p->name.c_str(), p->token.substr(i, 8).c_str(),
                   p->token.c_str());
    if (!failures)
        std::printf("ok   socket name %s holds no part of a token\n", p1.name.c_str());

    // ---- one handle does not open another export ----
    std::string edited = FD_PREFIX + p1.name + ":" + p2.id + ":" + p1.token;
    try {
        std::shared_ptr<void> p = a->getIpcDevPtr(edited);
        EXPECT(false, "a handle edited to export %s mapped it at %p", p2.id.c_str(), p.get());
    } catch (const c10::Error &e) {
        std::printf("ok   a handle edited to another export is refused: %s\n", e.what());
    }
    import_bounded(a, h2, 0x22, "after an edited handle");

    // ---- uid 65534 holding a valid handle gets nothing, even where it can reach the socket ----
    if (::geteuid() != 0) {
        std::printf("SKIP uid 65534 checks: not root (cannot run a second user)\n");
    } else {
        int st = nobody_imports(h1, 0x11);
        EXPECT(st == 0, "uid 65534 holding a handle: exit %d (0: refused, 2: mapped the block)", st);
        if (p1.name[0] == '/') { // defeat the directory's permissions: the peer check must hold
            std::string dir = p1.name.substr(0, p1.name.rfind('/'));
            struct stat sd {}, ss {};
            EXPECT(::stat(dir.c_str(), &sd) == 0 && (sd.st_mode & 077) == 0,
                   "the socket's directory %s is open to others (mode %o)", dir.c_str(), sd.st_mode & 0777);
            if (::stat(p1.name.c_str(), &ss) == 0 && ::chmod(dir.c_str(), 0755) == 0 &&
                ::chmod(p1.name.c_str(), 0777) == 0) {
                st = nobody_imports(h1, 0x11);
                EXPECT(st == 0, "uid 65534 reaching the socket: exit %d (0: refused, 2: mapped the block)", st);
                (void)::chmod(p1.name.c_str(), ss.st_mode & 07777);
                (void)::chmod(dir.c_str(), sd.st_mode & 07777);
            } else {
                EXPECT(false, "cannot open up %s: %s", dir.c_str(), std::strerror(errno));
            }
        }
        if (!failures)
            std::printf("ok   uid 65534 holding a valid handle is refused\n");
    }

    // ---- an import says why the exporter closed its connection ----
    {
        std::string m = import_from_stand_in(a, "L", false);
        EXPECT(contains(m, "the exporter dropped the connection under load") && contains(m, "retry the import") &&
                   !contains(m, "stale"),
               "a connection dropped under load: %s", m.c_str());
        m = import_from_stand_in(a, "U", false);
        EXPECT(contains(m, "does not admit this uid") && contains(m, "XSEG_TORCH_IPC_ALLOW_UIDS"),
               "a uid not admitted: %s", m.c_str());
        m = import_from_stand_in(a, "", true);
        EXPECT(contains(m, "stale") && !contains(m, "under load"), "a refused handle: %s", m.c_str());
        if (!failures)
            std::printf("ok   a dropped connection, a uid not admitted and a refused handle each say so\n");
    }

    // ---- a uid's connections are bounded: its oldest silent one goes, told why ----
    {
        std::vector<int> conns;
        for (int i = 0; i < 64; i++)
            conns.push_back(connect_to(p1.name));
        std::this_thread::sleep_for(std::chrono::milliseconds(500)); // all accepted (the server polls)
        pollfd pf{conns[0], POLLIN, 0};
        EXPECT(::poll(&pf, 1, 0) == 0, "the oldest of 64 silent connections was closed (the bound is 64 a uid)");
        conns.push_back(connect_to(p1.name)); // the 65th
        char why = 0;
        EXPECT(::poll(&pf, 1, BOUND_S * 1000) == 1 && ::read(conns[0], &why, 1) == 1 && why == 'L',
               "the oldest silent connection was not dropped with 'L' when a 65th came (got '%c')", why);
        pollfd second{conns[1], POLLIN, 0};
        EXPECT(::poll(&second, 1, 0) == 0, "the second silent connection was dropped too");
        import_bounded(a, h1, 0x11, "65 silent connections of this uid");
        for (int fd : conns)
            if (fd >= 0)
                ::close(fd);
        if (!failures)
            std::printf("ok   a 65th silent connection of a uid drops that uid's oldest, which is told why\n");
    }

    // ---- a silent peer (and one that sends part of a request) stalls no one ----
    int silent = connect_to(p1.name);
    EXPECT(silent >= 0, "cannot connect to %s: %s", p1.name.c_str(), std::strerror(errno));
    int partial = connect_to(p1.name);
    EXPECT(partial >= 0 && ::write(partial, "abc", 3) == 3, "partial request to %s", p1.name.c_str());
    import_bounded(a, h1, 0x11, "a silent connection open");
    std::vector<int> flood; // more silent connections than the server keeps waiting
    for (int i = 0; i < 100; i++)
        flood.push_back(connect_to(p1.name));
    EXPECT(flood.back() >= 0, "cannot connect a 100th time: %s", std::strerror(errno));
    import_bounded(a, h1, 0x11, "100 silent connections open");
    for (int fd : flood)
        if (fd >= 0)
            ::close(fd);
    if (::geteuid() == 0)
        silent_nobody_then_import(a, p1.name, h1, 0x11);
    ::close(silent);
    ::close(partial);

    a->raw_delete(b1);
    a->raw_delete(b2);
    if (failures)
        return 1;
    std::printf("ok   the descriptor server refuses other exports and other users, and no peer stalls it\n");
    return 0;
}
