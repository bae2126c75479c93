// Source of the sample images embedded in image_samples.h (see README.md).
// Two kernels, one with C linkage, and a device function that must not be listed as a kernel.
__device__ __noinline__ float tiny_twice(float v) { return 2.0f * v; }
__global__ void tiny_scale(float* x, float s) { x[threadIdx.x] *= s; }
extern "C" __global__ void tiny_apply(float* x) { x[threadIdx.x] = tiny_twice(x[threadIdx.x]); }
