// The harness's stand-in for CUDA's header: __nv_bfloat16 lives in cuda_cpu.h.
#pragma once
#include "../cuda_cpu.h"
