// What the harness's parts tell each other: the kernels by name (kernels.cpp)
// and the shared arrays the runtime fills at each block's start (shared.cpp,
// written by build.rs).

#pragma once

#include <cstddef>

namespace harness {

struct KernelEntry {
    const char *name;
    void (*call)(void **params);
};

// Every entry point of kernels/*.cu.
const KernelEntry *kernels(size_t *count);

struct SharedArray {
    unsigned char *data;
    size_t size;
};

}  // namespace harness

// Every __shared__ array of the kernels (shared.cpp).
extern "C" const harness::SharedArray adabatch_harness_shared[];
extern "C" const size_t adabatch_harness_shared_count;
