// The harness's runtime: a launch as OS threads, one per CUDA thread of a block,
// running the grid's blocks one after another; the barriers, warp shuffles and
// the checks that turn a divergent barrier, a deadlock or a stalled launch into
// an error (cuda_cpu.h says what is modelled and what is not).

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_cpu.h"
#include "kernels.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace harness {
namespace {

// Unwinds a thread's kernel once its launch has failed.
struct Abort {};

// Each barrier has its own lock, so that ThreadSanitizer sees the ordering a GPU
// gives (a warp's barrier orders that warp, the block's the block) and no more.
struct Barrier {
    std::mutex mu;
    std::condition_variable cv;
    int expected = 0;
    std::atomic<int> arrived{0};
    unsigned long generation = 0;
    std::atomic<const char *> site{nullptr};
    int pending_or = 0;
    int result_or = 0;
};

struct Warp {
    Barrier barrier;
    int lanes = 0;
    // Double-buffered: a lane writes one half while a slow lane may still read
    // the other, which the barrier between them keeps apart.
    uint64_t slots[2][32] = {};
};

struct Launch {
    void (*call)(void **) = nullptr;
    void **params = nullptr;
    const char *name = nullptr;
    dim3 grid{1, 1, 1}, block{1, 1, 1};
    int threads = 0;
    std::chrono::seconds watchdog{120};
    Barrier block_barrier;
    std::vector<Warp> warps;
    // Threads waiting at a barrier, of the block or of a warp: when every thread
    // waits and none of the barriers is complete, nothing can move again. Relaxed:
    // counting must not order the threads' memory.
    std::atomic<int> blocked{0};
    std::atomic<bool> failed{false};
    std::mutex error_mu;
    std::string error;
};

thread_local Launch *current = nullptr;
thread_local int linear_thread = 0;
thread_local unsigned shuffle_parity = 0;

const char *const BLOCK_START = "the block's start";
const char *const KERNEL_RETURN = "the kernel's return";

std::string where() {
    char text[160];
    std::snprintf(text, sizeof text, "block (%u, %u, %u), thread (%u, %u, %u)", blockIdx.x,
                  blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
    return text;
}

// Fails the launch (the first error is kept); every waiting thread sees it within
// its next wake-up (waits wake at least every 100 ms).
[[noreturn]] void fail(Launch &launch, const std::string &message) {
    {
        std::lock_guard<std::mutex> lock(launch.error_mu);
        if (!launch.failed.load()) {
            launch.error = std::string(launch.name) + ": " + message;
            launch.failed.store(true);
        }
    }
    launch.block_barrier.cv.notify_all();
    for (Warp &warp : launch.warps) {
        warp.barrier.cv.notify_all();
    }
    throw Abort{};
}

std::string waiting(const Launch &launch) {
    std::string text;
    auto add = [&](const Barrier &barrier, const std::string &scope) {
        const int arrived = barrier.arrived.load(std::memory_order_relaxed);
        const char *site = barrier.site.load(std::memory_order_relaxed);
        if (arrived > 0 && site != nullptr) {
            text += "; " + std::to_string(arrived) + " of " + std::to_string(barrier.expected) +
                    " threads of " + scope + " wait at " + site;
        }
    };
    add(launch.block_barrier, "the block");
    for (size_t w = 0; w < launch.warps.size(); ++w) {
        add(launch.warps[w].barrier, "warp " + std::to_string(w));
    }
    return text;
}

// Arrives at `barrier` (its lock held by `lock`) and waits for the others; the OR
// of their predicates.
int arrive(Launch &launch, std::unique_lock<std::mutex> &lock, Barrier &barrier, const char *site,
           int predicate) {
    if (launch.failed.load()) {
        throw Abort{};
    }
    const int arrived = barrier.arrived.load(std::memory_order_relaxed);
    if (arrived == 0) {
        barrier.site.store(site, std::memory_order_relaxed);
    } else if (std::strcmp(barrier.site.load(std::memory_order_relaxed), site) != 0) {
        const std::string other = barrier.site.load(std::memory_order_relaxed);
        lock.unlock();
        fail(launch, "divergent barriers: " + where() + " reached " + site + " while " +
                         std::to_string(arrived) + " threads wait at " + other);
    }
    barrier.pending_or |= predicate;
    if (arrived + 1 == barrier.expected) {
        barrier.result_or = barrier.pending_or;
        barrier.pending_or = 0;
        barrier.arrived.store(0, std::memory_order_relaxed);
        ++barrier.generation;
        launch.blocked.fetch_sub(barrier.expected - 1, std::memory_order_relaxed);
        barrier.cv.notify_all();
        return barrier.result_or;
    }
    barrier.arrived.store(arrived + 1, std::memory_order_relaxed);
    if (launch.blocked.fetch_add(1, std::memory_order_relaxed) + 1 == launch.threads) {
        lock.unlock();
        fail(launch, "deadlock: every thread waits and no barrier can complete (" + where() +
                         " arrived last at " + site + ")" + waiting(launch));
    }
    const unsigned long generation = barrier.generation;
    const auto deadline = std::chrono::steady_clock::now() + launch.watchdog;
    while (barrier.generation == generation && !launch.failed.load()) {
        barrier.cv.wait_for(lock, std::chrono::milliseconds(100));
        if (barrier.generation == generation && std::chrono::steady_clock::now() > deadline &&
            !launch.failed.load()) {
            lock.unlock();
            fail(launch, "watchdog: no progress for " + std::to_string(launch.watchdog.count()) +
                             " s; " + where() + " waits at " + site + waiting(launch));
        }
    }
    if (barrier.generation == generation) {
        throw Abort{};
    }
    return barrier.result_or;
}

Launch &running() {
    if (current == nullptr) {
        std::fprintf(stderr, "kernels harness: a barrier outside a launch\n");
        std::abort();
    }
    return *current;
}

void fill_shared_with_garbage() {
    for (size_t i = 0; i < adabatch_harness_shared_count; ++i) {
        std::memset(adabatch_harness_shared[i].data, 0xff, adabatch_harness_shared[i].size);
    }
}

struct ThreadStart {
    Launch *launch;
    int index;
};

void *thread_main(void *arg) {
    const ThreadStart start = *static_cast<ThreadStart *>(arg);
    Launch &launch = *start.launch;
    current = &launch;
    linear_thread = start.index;
    blockDim = launch.block;
    gridDim = launch.grid;
    const unsigned i = (unsigned)start.index;
    threadIdx = {i % launch.block.x, i / launch.block.x % launch.block.y,
                 i / (launch.block.x * launch.block.y)};
    try {
        for (unsigned z = 0; z < launch.grid.z; ++z) {
            for (unsigned y = 0; y < launch.grid.y; ++y) {
                for (unsigned x = 0; x < launch.grid.x; ++x) {
                    blockIdx = {x, y, z};
                    shuffle_parity = 0;
                    if (linear_thread == 0) {
                        fill_shared_with_garbage();
                    }
                    sync_block(BLOCK_START, 0);
                    launch.call(launch.params);
                    sync_block(KERNEL_RETURN, 0);
                }
            }
        }
    } catch (const Abort &) {
    }
    current = nullptr;
    return nullptr;
}

// CUDA's limits on a launch's shape (cudaErrorInvalidConfiguration).
std::string check_shape(const dim3 &grid, const dim3 &block) {
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0) {
        return "a launch of no blocks or no threads";
    }
    if (threads > 1024 || block.z > 64) {
        return "a block of " + std::to_string(threads) + " threads (at most 1024, z at most 64)";
    }
    if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
        return "a grid beyond (2^31 - 1, 65535, 65535)";
    }
    return "";
}

std::chrono::seconds watchdog_from_env() {
    const char *text = std::getenv("ADABATCH_HARNESS_WATCHDOG_S");
    const long seconds = text ? std::strtol(text, nullptr, 10) : 0;
    return std::chrono::seconds(seconds > 0 ? seconds : 120);
}

}  // namespace

int sync_block(const char *site, int predicate) {
    Launch &launch = running();
    std::unique_lock<std::mutex> lock(launch.block_barrier.mu);
    return arrive(launch, lock, launch.block_barrier, site, predicate);
}

void sync_warp(unsigned mask, const char *site) {
    Launch &launch = running();
    Warp &warp = launch.warps[linear_thread / 32];
    const unsigned all = warp.lanes == 32 ? 0xffffffffu : (1u << warp.lanes) - 1;
    if (mask != all) {
        fail(launch, std::string("a warp barrier over some lanes only (mask ") +
                         std::to_string(mask) + ") at " + site + ": the harness models whole warps");
    }
    std::unique_lock<std::mutex> lock(warp.barrier.mu);
    arrive(launch, lock, warp.barrier, site, 0);
}

uint64_t shuffle_xor(unsigned mask, uint64_t bits, int lane_mask, int width, const char *site) {
    Launch &launch = running();
    Warp &warp = launch.warps[linear_thread / 32];
    const int lane = linear_thread % 32;
    const int from = lane ^ lane_mask;
    if (width != 32 || mask != 0xffffffffu || warp.lanes != 32 || lane_mask < 0 || from >= 32) {
        fail(launch, std::string("a shuffle the harness does not model at ") + site +
                         " (a mask or width other than the whole warp of 32, or a partial warp)");
    }
    const unsigned half = shuffle_parity;
    shuffle_parity ^= 1u;
    std::unique_lock<std::mutex> lock(warp.barrier.mu);
    warp.slots[half][lane] = bits;
    arrive(launch, lock, warp.barrier, site, 0);
    return warp.slots[half][from];
}

}  // namespace harness

extern "C" {

// How many kernels the harness has, and the name of the i-th.
size_t adabatch_harness_kernel_count() {
    size_t count = 0;
    harness::kernels(&count);
    return count;
}

const char *adabatch_harness_kernel_name(size_t i) {
    size_t count = 0;
    const harness::KernelEntry *table = harness::kernels(&count);
    return i < count ? table[i].name : nullptr;
}

// Runs the kernel `name` over `grid` blocks of `block` threads, its arguments
// as cuLaunchKernel takes them (a pointer to each). 0 on success; otherwise 1
// and the reason in `error` (`error_len` bytes at most, NUL-terminated).
int adabatch_harness_launch(const char *name, const unsigned grid[3], const unsigned block[3],
                            void **params, char *error, size_t error_len) {
    using harness::Launch;
    auto report = [&](const std::string &message) {
        std::snprintf(error, error_len, "%s", message.c_str());
        return 1;
    };
    size_t count = 0;
    const harness::KernelEntry *table = harness::kernels(&count);
    const harness::KernelEntry *entry = nullptr;
    for (size_t i = 0; i < count && entry == nullptr; ++i) {
        if (std::strcmp(table[i].name, name) == 0) {
            entry = &table[i];
        }
    }
    if (entry == nullptr) {
        return report(std::string("no kernel ") + name + " in kernels/*.cu");
    }
    // One launch at a time: the blocks' shared arrays are the process's.
    static std::mutex one_at_a_time;
    std::lock_guard<std::mutex> serial(one_at_a_time);
    Launch launch;
    launch.call = entry->call;
    launch.params = params;
    launch.name = entry->name;
    launch.grid = {grid[0], grid[1], grid[2]};
    launch.block = {block[0], block[1], block[2]};
    const std::string shape = harness::check_shape(launch.grid, launch.block);
    if (!shape.empty()) {
        return report(std::string(name) + ": " + shape);
    }
    launch.threads = (int)(block[0] * block[1] * block[2]);
    launch.watchdog = harness::watchdog_from_env();
    launch.block_barrier.expected = launch.threads;
    launch.warps = std::vector<harness::Warp>((launch.threads + 31) / 32);
    for (size_t w = 0; w < launch.warps.size(); ++w) {
        const int left = launch.threads - 32 * (int)w;
        launch.warps[w].lanes = left < 32 ? left : 32;
        launch.warps[w].barrier.expected = launch.warps[w].lanes;
    }
    std::vector<harness::ThreadStart> starts(launch.threads);
    std::vector<pthread_t> threads(launch.threads);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 4u << 20);
    for (int i = 0; i < launch.threads; ++i) {
        starts[i] = {&launch, i};
        if (pthread_create(&threads[i], &attr, harness::thread_main, &starts[i]) != 0) {
            std::fprintf(stderr, "kernels harness: cannot start thread %d of %s\n", i, name);
            std::abort();
        }
    }
    pthread_attr_destroy(&attr);
    for (pthread_t thread : threads) {
        pthread_join(thread, nullptr);
    }
    return launch.failed ? report(launch.error) : 0;
}

}  // extern "C"
